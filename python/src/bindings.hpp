#pragma once
// The parts of the troupe._core extension module (python/src/core.cpp).
#include <nanobind/nanobind.h>

namespace troupe::python {

// Tokenizer, request conversion, prompt encoding, stream parsing and rendering.
void bind_recipe(nanobind::module_& m);
// troupe sim and the swarm.
void bind_sim(nanobind::module_& m);

}  // namespace troupe::python
