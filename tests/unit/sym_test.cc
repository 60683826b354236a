// Symbols: expressions, bounds, DynScalar and the write-once SymEnv with its error paths.
#include "splice/core/sym.h"

#include <gtest/gtest.h>

#include "splice/core/error.h"

namespace splice {
namespace {

TEST(Sym, ExpressionsEvaluateAndBound) {
  SymTable table;
  const SymId n = table.declare("n", 1, 100);
  const SymId m = table.declare("m", 0, 8);
  const SymExpr e = sym_min(SymExpr(n) + SymExpr(m) * 3 - 2, SymExpr(50));
  SymEnv env(table);
  env.bind(n, 10);
  env.bind(m, 4);
  EXPECT_EQ(e.eval(env), 20);
  EXPECT_EQ(e.upper_bound(table), 50);
  EXPECT_EQ(e.lower_bound(table), -1);
  EXPECT_EQ(sym_max(SymExpr(n), SymExpr(m)).upper_bound(table), 100);
  EXPECT_EQ((SymExpr(n) * -2).upper_bound(table), -2);
  EXPECT_EQ((SymExpr(n) * -2).lower_bound(table), -200);
  EXPECT_EQ((SymExpr(n) - SymExpr(m)).upper_bound(table), 100);
  EXPECT_EQ(e.str(&table), "min(((n + m*3) - 2), 50)");
  EXPECT_TRUE((SymExpr(3) + SymExpr(4)).is_constant());  // constants fold
  EXPECT_EQ((SymExpr(3) + SymExpr(4)).constant(), 7);
  EXPECT_TRUE(e.reads_symbols());
  EXPECT_TRUE((SymExpr(n) + 1).structurally_equal(SymExpr(n) + 1));
  EXPECT_FALSE((SymExpr(n) + 1).structurally_equal(SymExpr(m) + 1));
}

TEST(Sym, DynScalar) {
  SymTable table;
  const SymId k = table.declare("k_len", 1, 4096);
  const DynScalar c = DynScalar::Concrete(17);
  const DynScalar s = DynScalar::Sym(k);
  EXPECT_TRUE(c.is_concrete());
  EXPECT_EQ(c.concrete(), 17);
  EXPECT_FALSE(s.is_concrete());
  EXPECT_THROW(s.concrete(), ValueError);
  EXPECT_EQ(s.upper_bound(table), 4096);
  SymEnv env(table);
  env.bind("k_len", 300);
  EXPECT_EQ(s.eval(env), 300);
}

TEST(Sym, EnvIsWriteOncePerPass) {
  SymTable table;
  const SymId k = table.declare("k_len", 1, 64);
  SymEnv env(table);
  EXPECT_THROW(env.get(k), UnboundSymbolError);
  try {
    SymExpr(k).eval(env);
    FAIL();
  } catch (const UnboundSymbolError& e) {
    EXPECT_NE(std::string(e.what()).find("k_len"), std::string::npos);
  }
  env.bind(k, 5);
  env.bind(k, 5);  // same value: fine
  try {
    env.bind(k, 6);
    FAIL();
  } catch (const SymbolBindingError& e) {
    EXPECT_NE(std::string(e.what()).find("already bound to 5"), std::string::npos);
  }
  env.clear();
  EXPECT_FALSE(env.is_bound(k));
  env.bind(k, 6);
  EXPECT_EQ(env.get(k), 6);
}

TEST(Sym, RangeAndDeclarationErrors) {
  SymTable table;
  const SymId k = table.declare("k_len", 1, 64);
  SymEnv env(table);
  try {
    env.bind(k, 65);
    FAIL();
  } catch (const SymbolBindingError& e) {
    EXPECT_NE(std::string(e.what()).find("[1, 64]"), std::string::npos);
  }
  EXPECT_THROW(env.bind(k, 0), SymbolBindingError);
  EXPECT_THROW(env.bind("missing", 1), ValueError);
  EXPECT_THROW(table.declare("k_len", 0, 1), ValueError);
  EXPECT_THROW(table.declare("bad", 5, 4), ValueError);
  EXPECT_THROW(table.info(SymId{9}), ValueError);
}

TEST(Sym, Shapes) {
  SymTable table;
  const SymId k = table.declare("k_len", 1, 128);
  const SymShape shape{SymExpr(2), SymExpr(k), SymExpr(k) * 2};
  EXPECT_EQ(upper_bound_shape(shape, table), (std::vector<std::int64_t>{2, 128, 256}));
  SymEnv env(table);
  env.bind(k, 3);
  EXPECT_EQ(eval_shape(shape, env), (std::vector<std::int64_t>{2, 3, 6}));
  EXPECT_EQ(sym_shape_str(shape, &table), "[2, k_len, k_len*2]");
}

}  // namespace
}  // namespace splice
