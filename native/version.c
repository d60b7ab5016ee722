#include "inferd_native.h"

/* Bumped when a function's contract changes, so Python can refuse a stale build. */
int inferd_native_abi(void) { return 22; }
