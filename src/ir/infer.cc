// Shape and dtype rules of every op (see op.h for the semantics these rules type-check).
#include "ir/infer.h"

#include <algorithm>

#include "splice/core/error.h"

namespace splice {
namespace {

std::int64_t wrap(std::int64_t axis, std::size_t rank, const Node& n) {
  const auto r = static_cast<std::int64_t>(rank);
  const std::int64_t a = axis < 0 ? axis + r : axis;
  if (a < 0 || a >= r)
    fail<GraphError>(op_name(n.op), ": axis ", axis, " is out of range for rank ", r);
  return a;
}

void require_float(DType d, const Node& n, const char* what) {
  if (!is_floating(d))
    fail<GraphError>(op_name(n.op), ": `", what, "` must be a float tensor, got ", dtype_name(d));
}

void require_same_dtype(DType a, DType b, const Node& n) {
  if (a != b)
    fail<GraphError>(op_name(n.op), ": operand dtypes differ (", dtype_name(a), " vs ",
                     dtype_name(b), ")");
}

void require_arity(const Node& n, std::size_t count) {
  if (n.inputs.size() != count)
    fail<GraphError>(op_name(n.op), " takes ", count, " inputs, got ", n.inputs.size());
}

// Symbolic numel equality: products of constants equal and the symbolic factors equal as a
// multiset (structurally). Sound for the reshapes decode graphs use (splitting/merging heads).
bool same_numel(const SymShape& a, const SymShape& b) {
  std::int64_t ca = 1, cb = 1;
  std::vector<SymExpr> sa, sb;
  auto factor = [](const SymExpr& d, std::int64_t& c, std::vector<SymExpr>& syms) {
    if (d.is_constant())
      c *= d.constant();
    else if (d.kind() == SymExpr::Kind::mul_const)
      c *= d.factor(), syms.push_back(d.lhs());
    else
      syms.push_back(d);
  };
  for (const auto& d : a) factor(d, ca, sa);
  for (const auto& d : b) factor(d, cb, sb);
  if (ca != cb || sa.size() != sb.size()) return false;
  std::vector<bool> used(sb.size(), false);
  for (const auto& d : sa) {
    bool found = false;
    for (std::size_t j = 0; j < sb.size() && !found; ++j)
      if (!used[j] && d.structurally_equal(sb[j])) used[j] = found = true;
    if (!found) return false;
  }
  return true;
}

}  // namespace

Inferred infer_node(const Graph& g, const Node& n) {
  auto in = [&](std::size_t i) -> const Node& { return g.node(n.inputs.at(i)); };
  switch (n.op) {
    case Op::Input:
    case Op::Param:
    case Op::Constant:
    case Op::State:
      require_arity(n, 0);
      return {n.shape, n.dtype};
    case Op::SymValue:
      require_arity(n, 0);
      if (n.dtype != DType::i32 && n.dtype != DType::i64)
        fail<GraphError>("sym_value: dtype must be i32 or i64, got ", dtype_name(n.dtype));
      return {{SymExpr(1)}, n.dtype};
    case Op::Iota:
      require_arity(n, 0);
      wrap(n.attrs.axis, n.shape.size(), n);
      return {n.shape, n.dtype};
    case Op::Exp:
    case Op::Log:
    case Op::Neg:
    case Op::Abs:
    case Op::Sqrt:
    case Op::Rsqrt:
    case Op::Reciprocal:
    case Op::Sigmoid:
    case Op::Silu:
    case Op::Softplus:
    case Op::Tanh:
      require_arity(n, 1);
      require_float(in(0).dtype, n, "x");
      return {in(0).shape, in(0).dtype};
    case Op::Add:
    case Op::Sub:
    case Op::Mul:
    case Op::Div:
    case Op::Minimum:
    case Op::Maximum:
      require_arity(n, 2);
      require_same_dtype(in(0).dtype, in(1).dtype, n);
      return {broadcast_shapes(in(0).shape, in(1).shape, op_name(n.op)), in(0).dtype};
    case Op::Less:
    case Op::LessEqual:
    case Op::Greater:
    case Op::GreaterEqual:
    case Op::Equal:
      require_arity(n, 2);
      require_same_dtype(in(0).dtype, in(1).dtype, n);
      return {broadcast_shapes(in(0).shape, in(1).shape, op_name(n.op)), DType::boolean};
    case Op::Where: {
      require_arity(n, 3);
      if (in(0).dtype != DType::boolean)
        fail<GraphError>("where: `cond` must be bool, got ", dtype_name(in(0).dtype));
      require_same_dtype(in(1).dtype, in(2).dtype, n);
      SymShape s = broadcast_shapes(in(0).shape, in(1).shape, "where");
      return {broadcast_shapes(s, in(2).shape, "where"), in(1).dtype};
    }
    case Op::ReduceSum:
    case Op::ReduceMax:
    case Op::ReduceMean: {
      require_arity(n, 1);
      require_float(in(0).dtype, n, "x");
      SymShape s = in(0).shape;
      const std::int64_t a = wrap(n.attrs.axis, s.size(), n);
      if (n.attrs.keepdim)
        s[a] = SymExpr(1);
      else
        s.erase(s.begin() + a);
      return {s, in(0).dtype};
    }
    case Op::Softmax:
      require_arity(n, 1);
      require_float(in(0).dtype, n, "x");
      wrap(n.attrs.axis, in(0).shape.size(), n);
      return {in(0).shape, in(0).dtype};
    case Op::MatMul: {
      require_arity(n, 2);
      const SymShape &a = in(0).shape, &b = in(1).shape;
      require_float(in(0).dtype, n, "a");
      require_same_dtype(in(0).dtype, in(1).dtype, n);
      if (a.size() < 2 || b.size() < 2)
        fail<GraphError>("matmul: operands need rank >= 2, got ", sym_shape_str(a), " and ",
                         sym_shape_str(b));
      const SymExpr& ka = a[a.size() - 1];
      const SymExpr& kb = n.attrs.transpose_b ? b[b.size() - 1] : b[b.size() - 2];
      const SymExpr& nb = n.attrs.transpose_b ? b[b.size() - 2] : b[b.size() - 1];
      if (!ka.structurally_equal(kb))
        fail<GraphError>("matmul: inner dims differ: a ", sym_shape_str(a), ", b ",
                         sym_shape_str(b), n.attrs.transpose_b ? " (transposed)" : "");
      SymShape batch = broadcast_shapes(SymShape(a.begin(), a.end() - 2),
                                        SymShape(b.begin(), b.end() - 2), "matmul batch");
      batch.push_back(a[a.size() - 2]);
      batch.push_back(nb);
      return {batch, in(0).dtype};
    }
    case Op::Reshape:
      require_arity(n, 1);
      if (!same_numel(in(0).shape, n.shape))
        fail<GraphError>("reshape: cannot reshape ", sym_shape_str(in(0).shape), " into ",
                         sym_shape_str(n.shape));
      return {n.shape, in(0).dtype};
    case Op::Permute: {
      require_arity(n, 1);
      const SymShape& s = in(0).shape;
      if (n.attrs.perm.size() != s.size())
        fail<GraphError>("permute: perm of ", n.attrs.perm.size(), " axes for rank ", s.size());
      SymShape out(s.size());
      std::vector<bool> seen(s.size(), false);
      for (std::size_t i = 0; i < s.size(); ++i) {
        const std::int64_t p = wrap(n.attrs.perm[i], s.size(), n);
        if (seen[p]) fail<GraphError>("permute: axis ", p, " repeats");
        seen[p] = true;
        out[i] = s[p];
      }
      return {out, in(0).dtype};
    }
    case Op::Slice: {
      require_arity(n, 1);
      SymShape s = in(0).shape;
      const std::int64_t a = wrap(n.attrs.axis, s.size(), n);
      const auto& start = n.attrs.start;
      const auto& end = n.attrs.end;
      const SymTable& t = g.symbols();
      if (start.expr().lower_bound(t) < 0)
        fail<GraphError>("slice: start ", start.str(&t), " may be negative");
      if (end.upper_bound(t) > s[a].upper_bound(t))
        fail<GraphError>("slice: end ", end.str(&t), " (upper bound ", end.upper_bound(t),
                         ") may exceed the axis size ", s[a].str(&t));
      s[a] = end.expr() - start.expr();
      return {s, in(0).dtype};
    }
    case Op::Concat: {
      if (n.inputs.empty()) fail<GraphError>("concat: needs at least one input");
      SymShape s = in(0).shape;
      const std::int64_t a = wrap(n.attrs.axis, s.size(), n);
      SymExpr total = s[a];
      for (std::size_t i = 1; i < n.inputs.size(); ++i) {
        const SymShape& si = in(i).shape;
        require_same_dtype(in(0).dtype, in(i).dtype, n);
        if (si.size() != s.size())
          fail<GraphError>("concat: input ", i, " has rank ", si.size(), ", expected ", s.size());
        for (std::size_t d = 0; d < s.size(); ++d)
          if (static_cast<std::int64_t>(d) != a && !si[d].structurally_equal(s[d]))
            fail<GraphError>("concat: input ", i, " shape ", sym_shape_str(si), " differs from ",
                             sym_shape_str(s), " off the concat axis");
        total = total + si[a];
      }
      s[a] = total;
      return {s, in(0).dtype};
    }
    case Op::Gather: {
      require_arity(n, 2);
      if (in(1).dtype != DType::i32 && in(1).dtype != DType::i64)
        fail<GraphError>("gather: `indices` must be i32 or i64, got ", dtype_name(in(1).dtype));
      if (in(0).shape.empty()) fail<GraphError>("gather: `table` needs rank >= 1");
      SymShape s = in(1).shape;
      s.insert(s.end(), in(0).shape.begin() + 1, in(0).shape.end());
      return {s, in(0).dtype};
    }
    case Op::Cast:
      require_arity(n, 1);
      return {in(0).shape, n.dtype};
    case Op::WriteAt: {
      require_arity(n, 2);
      const Node& st = in(0);
      if (st.op != Op::State && st.op != Op::WriteAt)
        fail<GraphError>("write_at: `state` must be a state buffer (or a write_at of one), got ",
                         op_name(st.op));
      require_same_dtype(st.dtype, in(1).dtype, n);
      const SymShape& s = st.shape;
      const SymShape& v = in(1).shape;
      const std::int64_t a = wrap(n.attrs.axis, s.size(), n);
      if (v.size() != s.size())
        fail<GraphError>("write_at: value rank ", v.size(), " != state rank ", s.size());
      for (std::size_t d = 0; d < s.size(); ++d)
        if (static_cast<std::int64_t>(d) != a && !v[d].structurally_equal(s[d]))
          fail<GraphError>("write_at: value shape ", sym_shape_str(v), " does not match state ",
                           sym_shape_str(s), " off axis ", a);
      return {s, st.dtype};
    }
    case Op::Sequence:
      if (n.inputs.empty()) fail<GraphError>("sequence: needs a value input");
      return {in(0).shape, in(0).dtype};
    case Op::FlashDecode: {
      if (n.inputs.size() != 3 && n.inputs.size() != 4)
        fail<GraphError>("flash_decode takes q, k, v [, alibi], got ", n.inputs.size(), " inputs");
      if (!n.attrs.flash) fail<GraphError>("flash_decode: missing attributes");
      const SymShape &q = in(0).shape, &k = in(1).shape, &v = in(2).shape;
      if (q.size() != 4 || k.size() != 4 || !same_shape(k, v))
        fail<GraphError>(
            "flash_decode: q must be [B, Hq, Sq, D] and k, v [B, Hkv, capacity, D] "
            "of one shape; got q ",
            sym_shape_str(q), ", k ", sym_shape_str(k), ", v ", sym_shape_str(v));
      if (!q[0].structurally_equal(k[0]) || !q[3].structurally_equal(k[3]))
        fail<GraphError>("flash_decode: q ", sym_shape_str(q), " and k ", sym_shape_str(k),
                         " disagree on batch or head_dim");
      require_same_dtype(in(0).dtype, in(1).dtype, n);
      require_same_dtype(in(0).dtype, in(2).dtype, n);
      return {q, in(0).dtype};
    }
    case Op::KdaDecode:
      if (!n.attrs.kda) fail<GraphError>("kda_decode: missing attributes");
      if (n.inputs.size() < 11)
        fail<GraphError>("kda_decode takes the spec's argument list, got ", n.inputs.size(),
                         " inputs");
      return {n.shape, DType::bf16};
    case Op::RmsNorm: {
      require_arity(n, 2);
      require_float(in(0).dtype, n, "x");
      require_float(in(1).dtype, n, "weight");
      require_float(n.dtype, n, "out");
      const SymShape &x = in(0).shape, &w = in(1).shape;
      if (x.empty() || w.size() != 1 || !w[0].structurally_equal(x.back()))
        fail<GraphError>("rms_norm: `weight` must be [H] for `x` [..., H], got x ",
                         sym_shape_str(x), " and weight ", sym_shape_str(w));
      return {x, n.dtype};
    }
    case Op::MatMulAdd: {
      require_arity(n, 3);
      require_float(in(0).dtype, n, "a");
      require_same_dtype(in(0).dtype, in(1).dtype, n);
      require_float(in(2).dtype, n, "c");
      require_float(n.dtype, n, "out");
      const SymShape &a = in(0).shape, &b = in(1).shape, &c = in(2).shape;
      if (a.size() < 2 || b.size() != 2 || !a.back().structurally_equal(b[1]))
        fail<GraphError>("matmul_add: `a` must be [..., M, K] and `b` [N, K], got a ",
                         sym_shape_str(a), " and b ", sym_shape_str(b));
      SymShape y(a.begin(), a.end() - 1);
      y.push_back(b[0]);
      // c: the product's shape, or one that broadcasts to it (a bias [N]: the biased linear):
      // aligned from the last dim, each of c's dims is y's or 1.
      bool broadcasts = c.size() <= y.size();
      for (std::size_t i = 0; broadcasts && i < c.size(); ++i) {
        const SymExpr& dc = c[c.size() - 1 - i];
        broadcasts =
            dc.structurally_equal(y[y.size() - 1 - i]) || (dc.is_constant() && dc.constant() == 1);
      }
      if (!broadcasts)
        fail<GraphError>("matmul_add: `c` must have (or broadcast to) the product's shape ",
                         sym_shape_str(y), ", got ", sym_shape_str(c));
      return {y, n.dtype};
    }
    case Op::RmsNormMatMul: {
      require_arity(n, 3);
      require_float(in(0).dtype, n, "x");
      require_float(in(1).dtype, n, "weight");
      require_float(in(2).dtype, n, "w");
      require_float(n.dtype, n, "out");
      const SymShape &x = in(0).shape, &nw = in(1).shape, &w = in(2).shape;
      if (x.size() < 2 || nw.size() != 1 || !nw[0].structurally_equal(x.back()) || w.size() != 2 ||
          !w[1].structurally_equal(x.back()))
        fail<GraphError>(
            "rms_norm_matmul: `x` must be [..., M, K], `weight` [K] and `w` [N, K], got x ",
            sym_shape_str(x), ", weight ", sym_shape_str(nw), " and w ", sym_shape_str(w));
      SymShape y(x.begin(), x.end() - 1);
      y.push_back(w[0]);
      return {y, n.dtype};
    }
    case Op::RmsNormMatMulSwiglu: {
      // RmsNormMatMul's rule over the stacked gate|up weight w [2I, K], then the last axis halved.
      require_arity(n, 3);
      require_float(in(0).dtype, n, "x");
      require_float(in(1).dtype, n, "norm_weight");
      require_float(in(2).dtype, n, "w");
      require_float(n.dtype, n, "out");
      const SymShape &x = in(0).shape, &nw = in(1).shape, &w = in(2).shape;
      if (x.size() < 2 || nw.size() != 1 || !nw[0].structurally_equal(x.back()) || w.size() != 2 ||
          !w[1].structurally_equal(x.back()))
        fail<GraphError>(
            "rms_norm_matmul_swiglu: `x` must be [..., M, K], `norm_weight` [K] and `w` [2I, K], "
            "got x ",
            sym_shape_str(x), ", norm_weight ", sym_shape_str(nw), " and w ", sym_shape_str(w));
      if (!w[0].is_constant() || w[0].constant() % 2 != 0 || w[0].constant() < 2)
        fail<GraphError>(
            "rms_norm_matmul_swiglu: `w` must have a constant, even, nonzero row "
            "count 2I (gate rows then up rows), got ",
            sym_shape_str(w));
      SymShape y(x.begin(), x.end() - 1);
      y.push_back(SymExpr(w[0].constant() / 2));
      return {y, n.dtype};
    }
    case Op::SiluMulMatMulAdd: {
      require_arity(n, 4);
      require_float(in(0).dtype, n, "a");
      require_same_dtype(in(0).dtype, in(1).dtype, n);
      require_same_dtype(in(0).dtype, in(2).dtype, n);
      require_float(in(3).dtype, n, "c");
      require_float(n.dtype, n, "out");
      const SymShape &a = in(0).shape, &w = in(2).shape, &c = in(3).shape;
      if (!same_shape(a, in(1).shape))
        fail<GraphError>("silu_mul_matmul_add: `a` ", sym_shape_str(a), " and `b` ",
                         sym_shape_str(in(1).shape), " must have one shape");
      if (a.size() < 2 || w.size() != 2 || !a.back().structurally_equal(w[1]))
        fail<GraphError>("silu_mul_matmul_add: `a` must be [..., M, K] and `w` [N, K], got a ",
                         sym_shape_str(a), " and w ", sym_shape_str(w));
      SymShape y(a.begin(), a.end() - 1);
      y.push_back(w[0]);
      if (!same_shape(c, y))
        fail<GraphError>("silu_mul_matmul_add: `c` must have the product's shape ",
                         sym_shape_str(y), ", got ", sym_shape_str(c));
      return {y, n.dtype};
    }
    case Op::SiluMul:
      require_arity(n, 2);
      require_float(in(0).dtype, n, "a");
      require_same_dtype(in(0).dtype, in(1).dtype, n);
      if (!same_shape(in(0).shape, in(1).shape))
        fail<GraphError>("silu_mul: `a` ", sym_shape_str(in(0).shape), " and `b` ",
                         sym_shape_str(in(1).shape), " must have one shape");
      return {in(0).shape, in(0).dtype};
    case Op::Rope: {
      require_arity(n, 4);
      require_float(in(0).dtype, n, "x");
      require_float(in(1).dtype, n, "cos");
      require_same_dtype(in(1).dtype, in(2).dtype, n);
      const SymShape &x = in(0).shape, &c = in(1).shape;
      if (x.empty() || !x.back().is_constant() || x.back().constant() % 2 != 0)
        fail<GraphError>("rope: `x` must be [..., D] with a concrete even D, got ",
                         sym_shape_str(x));
      if (c.size() != 2 || !c[1].structurally_equal(x.back()) || !same_shape(c, in(2).shape))
        fail<GraphError>("rope: `cos` and `sin` must both be [max_seq_len, D] for x ",
                         sym_shape_str(x), ", got ", sym_shape_str(c), " and ",
                         sym_shape_str(in(2).shape));
      const Node& pos = in(3);
      if (pos.dtype != DType::i32 || pos.shape.size() != 1 || !pos.shape[0].is_constant() ||
          pos.shape[0].constant() != 1)
        fail<GraphError>("rope: `position` must be i32 [1], got ", dtype_name(pos.dtype),
                         sym_shape_str(pos.shape));
      return {x, in(0).dtype};
    }
    case Op::RopeKvAppend: {
      require_arity(n, 6);
      require_float(in(0).dtype, n, "qkv");
      require_float(in(1).dtype, n, "cos");
      require_same_dtype(in(1).dtype, in(2).dtype, n);
      require_same_dtype(in(0).dtype, in(4).dtype, n);
      require_same_dtype(in(0).dtype, in(5).dtype, n);
      const SymShape &x = in(0).shape, &c = in(1).shape, &kc = in(4).shape;
      if (x.size() != 3 || !x[1].is_constant() || x[1].constant() != 1 || !x[2].is_constant() ||
          kc.size() != 4 || !kc[1].is_constant() || !kc[3].is_constant() ||
          kc[3].constant() % 2 != 0 || !same_shape(kc, in(5).shape) ||
          !kc[0].structurally_equal(x[0]))
        fail<GraphError>(
            "rope_kv_append: `qkv` must be [B, 1, (Hq + 2 Hkv) D] and both caches [B, Hkv, "
            "capacity, D] (concrete heads, even D), got qkv ",
            sym_shape_str(x), ", k_cache ", sym_shape_str(kc), ", v_cache ",
            sym_shape_str(in(5).shape));
      const std::int64_t kv_heads = kc[1].constant(), dim = kc[3].constant();
      const std::int64_t row = x[2].constant();
      if (row % dim != 0 || row / dim <= 2 * kv_heads)
        fail<GraphError>("rope_kv_append: the `qkv` row of ", row, " is not (Hq + 2 * ", kv_heads,
                         ") * ", dim, " with Hq >= 1");
      if (c.size() != 2 || !c[1].structurally_equal(kc[3]) || !same_shape(c, in(2).shape))
        fail<GraphError>("rope_kv_append: `cos` and `sin` must both be [max_seq_len, D], got ",
                         sym_shape_str(c), " and ", sym_shape_str(in(2).shape));
      const Node& pos = in(3);
      if (pos.dtype != DType::i32 || pos.shape.size() != 1 || !pos.shape[0].is_constant() ||
          pos.shape[0].constant() != 1)
        fail<GraphError>("rope_kv_append: `position` must be i32 [1], got ", dtype_name(pos.dtype),
                         sym_shape_str(pos.shape));
      const std::int64_t heads = row / dim - 2 * kv_heads;
      return {{x[0], SymExpr(heads), SymExpr(1), kc[3]}, in(0).dtype};
    }
    case Op::RmsNormMatMulRopeKvAppend: {
      // RmsNormMatMul's rule over inputs 0 .. 2, then RopeKvAppend's over the q|k|v row it gives
      // (the caches' dtype) and inputs 3 .. 7.
      constexpr const char* kName = "rms_norm_matmul_rope_kv_append";
      require_arity(n, 8);
      require_float(in(0).dtype, n, "x");
      require_float(in(1).dtype, n, "norm_weight");
      require_float(in(2).dtype, n, "w");
      require_float(in(3).dtype, n, "cos");
      require_same_dtype(in(3).dtype, in(4).dtype, n);
      require_float(in(6).dtype, n, "k_cache");
      require_same_dtype(in(6).dtype, in(7).dtype, n);
      const SymShape &x = in(0).shape, &nw = in(1).shape, &w = in(2).shape, &c = in(3).shape,
                     &kc = in(6).shape;
      if (x.size() != 3 || !x[1].is_constant() || x[1].constant() != 1 || nw.size() != 1 ||
          !nw[0].structurally_equal(x[2]) || w.size() != 2 || !w[1].structurally_equal(x[2]) ||
          !w[0].is_constant())
        fail<GraphError>(kName,
                         ": `x` must be [B, 1, K], `norm_weight` [K] and `w` [N, K] with a "
                         "concrete N, got x ",
                         sym_shape_str(x), ", norm_weight ", sym_shape_str(nw), " and w ",
                         sym_shape_str(w));
      if (kc.size() != 4 || !kc[1].is_constant() || !kc[3].is_constant() ||
          kc[3].constant() % 2 != 0 || !same_shape(kc, in(7).shape) ||
          !kc[0].structurally_equal(x[0]))
        fail<GraphError>(kName,
                         ": both caches must be [B, Hkv, capacity, D] (x's B, concrete heads, "
                         "even D), got k_cache ",
                         sym_shape_str(kc), ", v_cache ", sym_shape_str(in(7).shape));
      const std::int64_t kv_heads = kc[1].constant(), dim = kc[3].constant();
      const std::int64_t row = w[0].constant();
      if (dim <= 0 || row % dim != 0 || row / dim <= 2 * kv_heads)
        fail<GraphError>(kName, ": the q|k|v row of N = ", row, " is not (Hq + 2 * ", kv_heads,
                         ") * ", dim, " with Hq >= 1");
      if (c.size() != 2 || !c[1].structurally_equal(kc[3]) || !same_shape(c, in(4).shape))
        fail<GraphError>(kName, ": `cos` and `sin` must both be [max_seq_len, D], got ",
                         sym_shape_str(c), " and ", sym_shape_str(in(4).shape));
      const Node& pos = in(5);
      if (pos.dtype != DType::i32 || pos.shape.size() != 1 || !pos.shape[0].is_constant() ||
          pos.shape[0].constant() != 1)
        fail<GraphError>(kName, ": `position` must be i32 [1], got ", dtype_name(pos.dtype),
                         sym_shape_str(pos.shape));
      const std::int64_t heads = row / dim - 2 * kv_heads;
      return {{x[0], SymExpr(heads), SymExpr(1), kc[3]}, in(6).dtype};
    }
    case Op::StateAfter:
      if (n.inputs.size() < 2)
        fail<GraphError>("state_after: needs the state and at least one effect to follow");
      return {in(0).shape, in(0).dtype};
    case Op::Branch:
      if (n.inputs.empty()) fail<GraphError>("branch: needs at least one arm");
      return {in(0).shape, in(0).dtype};
  }
  fail<GraphError>("unknown op ", static_cast<int>(n.op));
}

}  // namespace splice
