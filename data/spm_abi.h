// The interface between loom and libloom_spm.so (data/spm_shim.cpp), which a loom binary finds
// at run time beside itself or in its build: a shim of another interface is refused, not called.
// Raise kSpmAbi whenever a function's name, arguments or meaning changes.
#pragma once

namespace loom {
constexpr int kSpmAbi = 1;
}  // namespace loom
