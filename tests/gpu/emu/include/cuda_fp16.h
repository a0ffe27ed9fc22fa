/* kvd CUDA emulation shim: see emu.h */
#include "emu.h"
