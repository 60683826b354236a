// Text and Graphviz printers. Text: one line per live node in topological order,
//   %7 = matmul(%5, %6) transpose_b : bf16[1, 32, 1, k_len]  # layer0.attn.scores
// DOT: one box per node, each branch arm drawn as a cluster, the branch node as a diamond.
#include <sstream>

#include "splice/ir/graph.h"

namespace splice {
namespace {

std::string attrs_str(const Graph& g, const Node& n) {
  const SymTable* t = &g.symbols();
  std::ostringstream out;
  switch (n.op) {
    case Op::Input:
    case Op::Param:
    case Op::State:
      out << " '" << n.attrs.name << "'";
      break;
    case Op::SymValue:
      out << " value=" << n.attrs.value.str(t);
      break;
    case Op::Iota:
    case Op::Softmax:
    case Op::Concat:
      out << " axis=" << n.attrs.axis;
      break;
    case Op::ReduceSum:
    case Op::ReduceMax:
    case Op::ReduceMean:
      out << " axis=" << n.attrs.axis << (n.attrs.keepdim ? " keepdim" : "");
      break;
    case Op::MatMul:
      if (n.attrs.transpose_b) out << " transpose_b";
      break;
    case Op::Permute:
      out << " perm=" << dims_str(n.attrs.perm);
      break;
    case Op::Slice:
      out << " axis=" << n.attrs.axis << " [" << n.attrs.start.str(t) << ":" << n.attrs.end.str(t)
          << "]";
      break;
    case Op::WriteAt:
      out << " axis=" << n.attrs.axis << " offset=" << n.attrs.offset.str(t);
      break;
    case Op::FlashDecode: {
      const auto& f = *n.attrs.flash;
      out << " k_len=" << f.k_len.str(t) << " scale=" << f.softmax_scale
          << (f.causal ? " causal" : "");
      if (f.window_left) out << " window_left=" << *f.window_left;
      if (f.window_right) out << " window_right=" << *f.window_right;
      if (f.softcap) out << " softcap=" << *f.softcap;
      if (f.has_alibi) out << " alibi";
      break;
    }
    case Op::KdaDecode: {
      const auto& k = *n.attrs.kda;
      out << (k.packed ? " packed" : " plain")
          << " lower_bound=" << (k.lower_bound ? std::to_string(*k.lower_bound) : "none")
          << " eps=" << k.norm_eps;
      break;
    }
    case Op::RmsNorm:
    case Op::RmsNormMatMul:
    case Op::RmsNormMatMulRopeKvAppend:
    case Op::RmsNormMatMulSwiglu:
      out << " eps=" << n.attrs.eps;
      break;
    case Op::Branch: {
      const auto& b = *n.attrs.branch;
      out << " diverge=%" << b.diverge.index << " merge=%" << b.merge.index;
      if (!b.dispatch.empty()) {
        out << " dispatch={";
        for (std::size_t i = 0; i < b.dispatch.size(); ++i)
          out << (i ? ", " : "") << "[" << b.dispatch[i].lo << ".." << b.dispatch[i].hi << "]->"
              << b.dispatch[i].arm;
        out << "}";
      }
      break;
    }
    default:
      break;
  }
  return out.str();
}

}  // namespace

std::string print_graph(const Graph& g) {
  std::ostringstream out;
  const SymTable* t = &g.symbols();
  out << "graph: " << g.live_nodes().size() << " live nodes\n";
  for (std::size_t i = 0; i < t->size(); ++i) {
    const SymInfo& s = t->info(SymId{static_cast<std::uint32_t>(i)});
    out << "  sym " << s.name << " in [" << s.lo << ", " << s.hi << "]\n";
  }
  for (NodeId id : topological_order(g)) {
    const Node& n = g.node(id);
    out << "  %" << id.index << " = " << op_name(n.op) << "(";
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      out << (i ? ", " : "");
      if (n.op == Op::Branch) out << "arm" << i << "=";
      out << "%" << n.inputs[i].index;
    }
    out << ")" << attrs_str(g, n) << " : " << dtype_name(n.dtype) << sym_shape_str(n.shape, t);
    if (n.op == Op::Branch) {
      out << "  # arms:";
      for (const auto& l : n.attrs.branch->arm_labels) out << " " << l;
    } else if (!n.label.empty()) {
      out << "  # " << n.label;
    }
    out << "\n";
  }
  for (const auto& [name, id] : g.outputs())
    out << "  output " << name << " = %" << id.index << "\n";
  return out.str();
}

std::string graph_to_dot(const Graph& g) {
  std::ostringstream out;
  out << "digraph splice {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\", "
         "fontsize=10];\n";
  std::vector<int> cluster_of(g.size(), -1);
  int cluster = 0;
  for (NodeId id : g.live_nodes()) {
    const Node& n = g.node(id);
    if (n.op != Op::Branch) continue;
    for (std::size_t arm = 0; arm < n.inputs.size(); ++arm) {
      out << "  subgraph cluster_" << cluster << " {\n    label=\"%" << id.index << " arm " << arm
          << ": " << n.attrs.branch->arm_labels.at(arm)
          << "\";\n    style=rounded; color=" << (arm == 0 ? "gray40" : "blue") << ";\n";
      for (NodeId m : arm_interior(g, n.attrs.branch->diverge, n.inputs[arm])) {
        cluster_of[m.index] = cluster;
        out << "    n" << m.index << ";\n";
      }
      out << "  }\n";
      ++cluster;
    }
  }
  for (NodeId id : g.live_nodes()) {
    const Node& n = g.node(id);
    out << "  n" << id.index << " [label=\"%" << id.index << " " << op_name(n.op)
        << attrs_str(g, n).substr(0, 40) << "\\n"
        << dtype_name(n.dtype) << sym_shape_str(n.shape, &g.symbols()) << "\"";
    if (n.op == Op::Branch) out << ", shape=diamond";
    if (is_source(n.op)) out << ", style=filled, fillcolor=gray92";
    out << "];\n";
    for (NodeId in : n.inputs) out << "  n" << in.index << " -> n" << id.index << ";\n";
  }
  out << "}\n";
  return out.str();
}

}  // namespace splice
