// Registers the CUDA engine (kernels/cuda/cuda_backend.hpp) as device = "cuda". Part of the
// troupe CLI only, and only when it is built with the CUDA engine (cmake/cuda.cmake).
#pragma once

namespace troupe::cluster {

void add_cuda_engine();

} // namespace troupe::cluster
