// Umbrella header of the mixprec C++ API.
#pragma once

#include "mixprec/build_info.h"
#include "mixprec/ops.h"
