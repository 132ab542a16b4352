// Placeholder: implemented on the heartbeat branch.
#include "heartbeat.h"
