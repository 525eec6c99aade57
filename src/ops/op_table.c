/* The rows of the op table (op_table.h): name, backward function, autocast class. */
#include "ops/op_table.h"

#define CT_OP_ROW_(N, n, ac) [CT_OP_##N] = {#n, ct_bw_##n, ac},
const ct_op_def ct_op_table[CT_OP_COUNT] = {CT_OP_LIST(CT_OP_ROW_)};
#undef CT_OP_ROW_

#define CT_OP_ROW_LP_(N, n, ac) [CT_OP_##N] = {#n, ct_bw_lowp, ac},
const ct_op_def ct_op_table_lp[CT_OP_COUNT] = {CT_OP_LIST(CT_OP_ROW_LP_)};
#undef CT_OP_ROW_LP_
