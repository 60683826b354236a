// Op names and classification (see op.h).
#include "splice/ir/op.h"

namespace splice {

const char* op_name(Op op) {
  switch (op) {
    case Op::Input:
      return "input";
    case Op::Param:
      return "param";
    case Op::Constant:
      return "constant";
    case Op::State:
      return "state";
    case Op::SymValue:
      return "sym_value";
    case Op::Iota:
      return "iota";
    case Op::Exp:
      return "exp";
    case Op::Log:
      return "log";
    case Op::Neg:
      return "neg";
    case Op::Abs:
      return "abs";
    case Op::Sqrt:
      return "sqrt";
    case Op::Rsqrt:
      return "rsqrt";
    case Op::Reciprocal:
      return "reciprocal";
    case Op::Sigmoid:
      return "sigmoid";
    case Op::Silu:
      return "silu";
    case Op::Softplus:
      return "softplus";
    case Op::Tanh:
      return "tanh";
    case Op::Add:
      return "add";
    case Op::Sub:
      return "sub";
    case Op::Mul:
      return "mul";
    case Op::Div:
      return "div";
    case Op::Minimum:
      return "minimum";
    case Op::Maximum:
      return "maximum";
    case Op::Less:
      return "less";
    case Op::LessEqual:
      return "less_equal";
    case Op::Greater:
      return "greater";
    case Op::GreaterEqual:
      return "greater_equal";
    case Op::Equal:
      return "equal";
    case Op::Where:
      return "where";
    case Op::ReduceSum:
      return "reduce_sum";
    case Op::ReduceMax:
      return "reduce_max";
    case Op::ReduceMean:
      return "reduce_mean";
    case Op::Softmax:
      return "softmax";
    case Op::MatMul:
      return "matmul";
    case Op::Reshape:
      return "reshape";
    case Op::Permute:
      return "permute";
    case Op::Slice:
      return "slice";
    case Op::Concat:
      return "concat";
    case Op::Gather:
      return "gather";
    case Op::Cast:
      return "cast";
    case Op::WriteAt:
      return "write_at";
    case Op::Sequence:
      return "sequence";
    case Op::StateAfter:
      return "state_after";
    case Op::FlashDecode:
      return "flash_decode";
    case Op::KdaDecode:
      return "kda_decode";
    case Op::RmsNorm:
      return "rms_norm";
    case Op::SiluMul:
      return "silu_mul";
    case Op::Rope:
      return "rope";
    case Op::MatMulAdd:
      return "matmul_add";
    case Op::RmsNormMatMul:
      return "rms_norm_matmul";
    case Op::SiluMulMatMulAdd:
      return "silu_mul_matmul_add";
    case Op::RopeKvAppend:
      return "rope_kv_append";
    case Op::RmsNormMatMulRopeKvAppend:
      return "rms_norm_matmul_rope_kv_append";
    case Op::RmsNormMatMulSwiglu:
      return "rms_norm_matmul_swiglu";
    case Op::Branch:
      return "branch";
  }
  return "?";
}

bool is_unary(Op op) { return op >= Op::Exp && op <= Op::Tanh; }
bool is_binary_arith(Op op) { return op >= Op::Add && op <= Op::Maximum; }
bool is_compare(Op op) { return op >= Op::Less && op <= Op::Equal; }
bool is_reduce(Op op) { return op >= Op::ReduceSum && op <= Op::ReduceMean; }
bool is_source(Op op) {
  return op == Op::Input || op == Op::Param || op == Op::Constant || op == Op::State;
}
bool is_view(Op op) {
  return op == Op::Permute || op == Op::Slice || op == Op::WriteAt || op == Op::Sequence ||
         op == Op::StateAfter || op == Op::Branch;
}
bool has_effect(Op op) {
  return op == Op::WriteAt || op == Op::KdaDecode || op == Op::RopeKvAppend ||
         op == Op::RmsNormMatMulRopeKvAppend;
}

}  // namespace splice
