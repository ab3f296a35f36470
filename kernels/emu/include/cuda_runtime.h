// The CUDA emulation's stand-in for <cuda_runtime.h>: on the include path of emulated builds
// only, ahead of the toolkit's, so kernels/cuda/ compiles unchanged for the host.
#pragma once
#include "kernels/emu/runtime.h"
