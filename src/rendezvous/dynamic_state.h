// Placeholder: the dynamic rendezvous's state and its pure transitions
// (implemented on the dynamic branch).
#pragma once
