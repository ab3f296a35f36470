// Built only by tests/e2e/layers.sh: a model-layer source that reaches up into the trainer.
// The build must refuse it (the model layer's include root has no train/).
#include "train/trainer.h"

int layer_probe_up() { return 0; }
