// splice/core/sym.h: symbolic lengths.
//
// A decode graph is planned once and replayed every token, so lengths that change per token
// (live KV length, write offset, position) are symbols:
//   1. `SymTable` declares each symbol with a name and a range [lo, hi].
//   2. `SymExpr` is an integer expression over symbols: constant, symbol, a + b, a - b,
//      a * constant, min(a, b), max(a, b). It evaluates under a `SymEnv` and has interval
//      bounds under a `SymTable` (upper bounds size the buffers at planning time).
//   3. `DynScalar` is a scalar parameter of an op: Concrete(n) or a SymExpr.
//   4. `SymEnv` binds symbols for one pass: each at most once (rebinding to another value is an
//      error), only inside its declared range, and reading an unbound symbol is an error.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace splice {

struct SymId {
  std::uint32_t id = 0;
  bool operator==(const SymId&) const = default;
};

struct SymInfo {
  std::string name;
  std::int64_t lo = 0;
  std::int64_t hi = 0;
};

class SymTable {
 public:
  // Declares a new symbol; throws ValueError if lo > hi or the name is taken.
  SymId declare(const std::string& name, std::int64_t lo, std::int64_t hi);
  const SymInfo& info(SymId id) const;
  std::optional<SymId> find(const std::string& name) const;
  std::size_t size() const { return symbols_.size(); }

 private:
  std::vector<SymInfo> symbols_;
};

class SymEnv;

class SymExpr {
 public:
  enum class Kind : std::uint8_t { constant, symbol, add, sub, mul_const, min, max };

  SymExpr() : SymExpr(std::int64_t{0}) {}
  SymExpr(std::int64_t value);  // NOLINT: constants convert implicitly
  SymExpr(SymId id);            // NOLINT: symbols convert implicitly

  Kind kind() const { return node_->kind; }
  bool is_constant() const { return node_->kind == Kind::constant; }
  std::int64_t constant() const { return node_->value; }
  std::int64_t factor() const { return node_->value; }  // the constant of a mul_const node
  SymId symbol() const { return node_->symbol; }
  const SymExpr& lhs() const { return node_->operands[0]; }
  const SymExpr& rhs() const { return node_->operands[1]; }

  // The value under `env`; throws UnboundSymbolError when a symbol it reads is unbound.
  std::int64_t eval(const SymEnv& env) const;
  // Interval bounds over the declared symbol ranges.
  std::int64_t upper_bound(const SymTable& table) const;
  std::int64_t lower_bound(const SymTable& table) const;
  // Appends every symbol the expression reads.
  void collect_symbols(std::vector<SymId>& out) const;
  bool reads_symbols() const;
  std::string str(const SymTable* table = nullptr) const;
  bool structurally_equal(const SymExpr& other) const;

  friend SymExpr operator+(const SymExpr& a, const SymExpr& b);
  friend SymExpr operator-(const SymExpr& a, const SymExpr& b);
  friend SymExpr operator*(const SymExpr& a, std::int64_t c);
  friend SymExpr sym_min(const SymExpr& a, const SymExpr& b);
  friend SymExpr sym_max(const SymExpr& a, const SymExpr& b);

 private:
  struct Node {
    Kind kind = Kind::constant;
    std::int64_t value = 0;  // constant, or the factor of mul_const
    SymId symbol;
    std::vector<SymExpr> operands;
  };
  explicit SymExpr(std::shared_ptr<const Node> node) : node_(std::move(node)) {}
  static SymExpr make(Kind kind, std::vector<SymExpr> operands, std::int64_t value = 0);
  std::shared_ptr<const Node> node_;
};

// A scalar op parameter: a concrete value or a symbolic expression.
class DynScalar {
 public:
  DynScalar() = default;
  static DynScalar Concrete(std::int64_t value) { return DynScalar(SymExpr(value)); }
  static DynScalar Sym(SymId id) { return DynScalar(SymExpr(id)); }
  static DynScalar Expr(SymExpr expr) { return DynScalar(std::move(expr)); }

  bool is_concrete() const { return expr_.is_constant(); }
  std::int64_t concrete() const;  // throws ValueError if symbolic
  const SymExpr& expr() const { return expr_; }
  std::int64_t eval(const SymEnv& env) const { return expr_.eval(env); }
  std::int64_t upper_bound(const SymTable& table) const { return expr_.upper_bound(table); }
  std::string str(const SymTable* table = nullptr) const { return expr_.str(table); }

 private:
  explicit DynScalar(SymExpr expr) : expr_(std::move(expr)) {}
  SymExpr expr_;
};

// A shape whose dims may be symbolic.
using SymShape = std::vector<SymExpr>;
std::string sym_shape_str(const SymShape& shape, const SymTable* table = nullptr);
SymShape sym_shape_of(const std::vector<std::int64_t>& dims);

class SymEnv {
 public:
  explicit SymEnv(const SymTable& table);
  // Binds `id` to `value` for this pass. Rebinding to the same value is allowed; to another value,
  // or outside the declared range, throws SymbolBindingError.
  void bind(SymId id, std::int64_t value);
  void bind(const std::string& name, std::int64_t value);
  std::int64_t get(SymId id) const;  // throws UnboundSymbolError
  bool is_bound(SymId id) const;
  const SymTable& table() const { return *table_; }
  // Starts a new pass: every symbol unbound again.
  void clear();

 private:
  const SymTable* table_;
  std::vector<std::optional<std::int64_t>> values_;
};

std::vector<std::int64_t> eval_shape(const SymShape& shape, const SymEnv& env);
std::vector<std::int64_t> upper_bound_shape(const SymShape& shape, const SymTable& table);

}  // namespace splice
