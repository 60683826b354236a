// Symbol table, symbolic expressions and per-pass bindings (see sym.h).
#include "splice/core/sym.h"

#include <algorithm>
#include <sstream>

#include "splice/core/error.h"

namespace splice {

SymId SymTable::declare(const std::string& name, std::int64_t lo, std::int64_t hi) {
  if (lo > hi)
    fail<ValueError>("symbol '", name, "' range [", lo, ", ", hi, "] is empty: lo must be <= hi");
  if (find(name)) fail<ValueError>("symbol '", name, "' is already declared");
  symbols_.push_back({name, lo, hi});
  return SymId{static_cast<std::uint32_t>(symbols_.size() - 1)};
}

const SymInfo& SymTable::info(SymId id) const {
  if (id.id >= symbols_.size())
    fail<ValueError>("symbol id ", id.id, " is not declared (", symbols_.size(), " symbols)");
  return symbols_[id.id];
}

std::optional<SymId> SymTable::find(const std::string& name) const {
  for (std::size_t i = 0; i < symbols_.size(); ++i)
    if (symbols_[i].name == name) return SymId{static_cast<std::uint32_t>(i)};
  return std::nullopt;
}

SymExpr::SymExpr(std::int64_t value) {
  auto node = std::make_shared<Node>();
  node->kind = Kind::constant;
  node->value = value;
  node_ = std::move(node);
}

SymExpr::SymExpr(SymId id) {
  auto node = std::make_shared<Node>();
  node->kind = Kind::symbol;
  node->symbol = id;
  node_ = std::move(node);
}

SymExpr SymExpr::make(Kind kind, std::vector<SymExpr> operands, std::int64_t value) {
  auto node = std::make_shared<Node>();
  node->kind = kind;
  node->value = value;
  node->operands = std::move(operands);
  return SymExpr(std::shared_ptr<const Node>(std::move(node)));
}

// Constant folding keeps concrete graphs concrete: Concrete(a) + Concrete(b) is Concrete(a+b).
SymExpr operator+(const SymExpr& a, const SymExpr& b) {
  if (a.is_constant() && b.is_constant()) return SymExpr(a.constant() + b.constant());
  if (b.is_constant() && b.constant() == 0) return a;
  if (a.is_constant() && a.constant() == 0) return b;
  return SymExpr::make(SymExpr::Kind::add, {a, b});
}
SymExpr operator-(const SymExpr& a, const SymExpr& b) {
  if (a.is_constant() && b.is_constant()) return SymExpr(a.constant() - b.constant());
  if (b.is_constant() && b.constant() == 0) return a;
  return SymExpr::make(SymExpr::Kind::sub, {a, b});
}
SymExpr operator*(const SymExpr& a, std::int64_t c) {
  if (a.is_constant()) return SymExpr(a.constant() * c);
  if (c == 1) return a;
  return SymExpr::make(SymExpr::Kind::mul_const, {a}, c);
}
SymExpr sym_min(const SymExpr& a, const SymExpr& b) {
  if (a.is_constant() && b.is_constant()) return SymExpr(std::min(a.constant(), b.constant()));
  return SymExpr::make(SymExpr::Kind::min, {a, b});
}
SymExpr sym_max(const SymExpr& a, const SymExpr& b) {
  if (a.is_constant() && b.is_constant()) return SymExpr(std::max(a.constant(), b.constant()));
  return SymExpr::make(SymExpr::Kind::max, {a, b});
}

std::int64_t SymExpr::eval(const SymEnv& env) const {
  switch (kind()) {
    case Kind::constant:
      return node_->value;
    case Kind::symbol:
      return env.get(node_->symbol);
    case Kind::add:
      return lhs().eval(env) + rhs().eval(env);
    case Kind::sub:
      return lhs().eval(env) - rhs().eval(env);
    case Kind::mul_const:
      return lhs().eval(env) * node_->value;
    case Kind::min:
      return std::min(lhs().eval(env), rhs().eval(env));
    case Kind::max:
      return std::max(lhs().eval(env), rhs().eval(env));
  }
  SPLICE_INTERNAL_CHECK(false, "unknown SymExpr kind");
}

std::int64_t SymExpr::upper_bound(const SymTable& table) const {
  if (kind() == Kind::mul_const) {
    const std::int64_t c = node_->value;
    return c >= 0 ? lhs().upper_bound(table) * c : lhs().lower_bound(table) * c;
  }
  if (kind() == Kind::add || kind() == Kind::sub || kind() == Kind::min || kind() == Kind::max) {
    const std::int64_t a_hi = lhs().upper_bound(table), b_hi = rhs().upper_bound(table);
    const std::int64_t b_lo = rhs().lower_bound(table);
    switch (kind()) {
      case Kind::add:
        return a_hi + b_hi;
      case Kind::sub:
        return a_hi - b_lo;
      case Kind::min:
        return std::min(a_hi, b_hi);
      default:
        return std::max(a_hi, b_hi);
    }
  }
  if (kind() == Kind::symbol) return table.info(node_->symbol).hi;
  return node_->value;
}

std::int64_t SymExpr::lower_bound(const SymTable& table) const {
  if (kind() == Kind::mul_const) {
    const std::int64_t c = node_->value;
    return c >= 0 ? lhs().lower_bound(table) * c : lhs().upper_bound(table) * c;
  }
  if (kind() == Kind::add || kind() == Kind::sub || kind() == Kind::min || kind() == Kind::max) {
    const std::int64_t a_lo = lhs().lower_bound(table), b_lo = rhs().lower_bound(table);
    const std::int64_t b_hi = rhs().upper_bound(table);
    switch (kind()) {
      case Kind::add:
        return a_lo + b_lo;
      case Kind::sub:
        return a_lo - b_hi;
      case Kind::min:
        return std::min(a_lo, b_lo);
      default:
        return std::max(a_lo, b_lo);
    }
  }
  if (kind() == Kind::symbol) return table.info(node_->symbol).lo;
  return node_->value;
}

void SymExpr::collect_symbols(std::vector<SymId>& out) const {
  if (kind() == Kind::symbol) {
    if (std::find(out.begin(), out.end(), node_->symbol) == out.end()) out.push_back(node_->symbol);
    return;
  }
  for (const auto& op : node_->operands) op.collect_symbols(out);
}

bool SymExpr::reads_symbols() const {
  std::vector<SymId> ids;
  collect_symbols(ids);
  return !ids.empty();
}

std::string SymExpr::str(const SymTable* table) const {
  switch (kind()) {
    case Kind::constant:
      return std::to_string(node_->value);
    case Kind::symbol:
      return table && node_->symbol.id < table->size() ? table->info(node_->symbol).name
                                                       : "s" + std::to_string(node_->symbol.id);
    case Kind::add:
      return "(" + lhs().str(table) + " + " + rhs().str(table) + ")";
    case Kind::sub:
      return "(" + lhs().str(table) + " - " + rhs().str(table) + ")";
    case Kind::mul_const:
      return lhs().str(table) + "*" + std::to_string(node_->value);
    case Kind::min:
      return "min(" + lhs().str(table) + ", " + rhs().str(table) + ")";
    case Kind::max:
      return "max(" + lhs().str(table) + ", " + rhs().str(table) + ")";
  }
  return "?";
}

bool SymExpr::structurally_equal(const SymExpr& other) const {
  if (node_ == other.node_) return true;
  if (kind() != other.kind() || node_->value != other.node_->value) return false;
  if (kind() == Kind::symbol) return node_->symbol == other.node_->symbol;
  if (node_->operands.size() != other.node_->operands.size()) return false;
  for (std::size_t i = 0; i < node_->operands.size(); ++i)
    if (!node_->operands[i].structurally_equal(other.node_->operands[i])) return false;
  return true;
}

std::int64_t DynScalar::concrete() const {
  if (!is_concrete()) fail<ValueError>("scalar ", expr_.str(), " is symbolic, not concrete");
  return expr_.constant();
}

std::string sym_shape_str(const SymShape& shape, const SymTable* table) {
  std::ostringstream out;
  out << "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i].str(table);
  out << "]";
  return out.str();
}

SymShape sym_shape_of(const std::vector<std::int64_t>& dims) {
  return SymShape(dims.begin(), dims.end());
}

SymEnv::SymEnv(const SymTable& table) : table_(&table), values_(table.size()) {}

void SymEnv::bind(SymId id, std::int64_t value) {
  const SymInfo& info = table_->info(id);
  if (values_.size() < table_->size()) values_.resize(table_->size());
  if (value < info.lo || value > info.hi)
    fail<SymbolBindingError>("symbol '", info.name, "' = ", value,
                             " is outside its declared range [", info.lo, ", ", info.hi, "]");
  auto& slot = values_[id.id];
  if (slot && *slot != value)
    fail<SymbolBindingError>("symbol '", info.name, "' is already bound to ", *slot,
                             " in this pass; cannot rebind it to ", value);
  slot = value;
}

void SymEnv::bind(const std::string& name, std::int64_t value) {
  auto id = table_->find(name);
  if (!id) fail<ValueError>("no symbol named '", name, "' is declared");
  bind(*id, value);
}

std::int64_t SymEnv::get(SymId id) const {
  const SymInfo& info = table_->info(id);
  if (id.id >= values_.size() || !values_[id.id])
    fail<UnboundSymbolError>("symbol '", info.name, "' is read but not bound in this pass");
  return *values_[id.id];
}

bool SymEnv::is_bound(SymId id) const {
  return id.id < values_.size() && values_[id.id].has_value();
}

void SymEnv::clear() { values_.assign(table_->size(), std::nullopt); }

std::vector<std::int64_t> eval_shape(const SymShape& shape, const SymEnv& env) {
  std::vector<std::int64_t> out(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i) out[i] = shape[i].eval(env);
  return out;
}

std::vector<std::int64_t> upper_bound_shape(const SymShape& shape, const SymTable& table) {
  std::vector<std::int64_t> out(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i) out[i] = shape[i].upper_bound(table);
  return out;
}

}  // namespace splice
