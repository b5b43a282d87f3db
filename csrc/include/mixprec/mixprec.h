// Umbrella header of the mixprec C++ API: the ops (dispatcher calls), the
// build information, GradScaler, AutocastGuard, the fused optimizers and
// CapturedStep (a whole step in one CUDA graph).
#pragma once

#include "mixprec/autocast_guard.h"
#include "mixprec/build_info.h"
#include "mixprec/capture.h"
#include "mixprec/grad_scaler.h"
#include "mixprec/ops.h"
#include "mixprec/optim.h"
#include "mixprec/serialize.h"
