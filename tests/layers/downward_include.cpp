// Built only by tests/e2e/layers.sh: the same probe reaching down (model -> runtime), which must
// build, so the upward probe fails for its direction and not for its flags.
#include "runtime/config.h"

int layer_probe_down() { return 0; }
