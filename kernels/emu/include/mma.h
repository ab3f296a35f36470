// The CUDA emulation's stand-in for <mma.h> (WMMA).
#pragma once
#include "kernels/emu/wmma.h"
