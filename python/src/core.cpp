// troupe._core: the extension module behind the `troupe` Python package (docs/python.md).
//
// The Python modules troupe.recipe and troupe.sim give the public API; this module is their thin
// native layer: the recipe (python/src/recipe.cpp) and the simulator (python/src/sim.cpp) with
// the GIL released during the long calls. Its stubs are python/troupe/_core.pyi.
#include "bindings.hpp"

NB_MODULE(_core, m) {
  m.doc() = "troupe's native layer: the recipe and the simulator (use troupe.recipe, troupe.sim)";
  m.attr("__version__") = TROUPE_VERSION;
  troupe::python::bind_recipe(m);
  troupe::python::bind_sim(m);
}
