/* ctrain/ctrain.h — everything. See docs/tutorial.md for a walk through. */
#ifndef CTRAIN_H
#define CTRAIN_H
#include "ctrain/core.h"
#include "ctrain/tensor.h"
#include "ctrain/autograd.h"
#include "ctrain/ops.h"
#include "ctrain/nn.h"
#include "ctrain/models.h"
#include "ctrain/optim.h"
#include "ctrain/io.h"
#include "ctrain/metrics.h"
#include "ctrain/data.h"
#include "ctrain/loader.h"
#include "ctrain/dist.h"
#include "ctrain/ddp.h"
#include "ctrain/fsdp.h"
#include "ctrain/train.h"
#include "ctrain/config.h"
#include "ctrain/launch.h"
#include "ctrain/text.h"
#endif
