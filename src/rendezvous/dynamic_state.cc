// Placeholder: implemented on the dynamic branch.
#include "dynamic_state.h"
