/* stands in for the CUDA header of this name under emulation */
#include "../cuda_emu.h"
