// The CUDA emulation's stand-in for <cuda_bf16.h>.
#pragma once
#include "kernels/emu/bf16.h"
