// splice/model/tokenizer.h: byte-level BPE (GPT-2 family) encode and decode.
//
// Sources: a GGUF file's `tokenizer.ggml.*` metadata (model "gpt2") or a Hugging Face
// `tokenizer.json` (model type "BPE" with a ByteLevel pre-tokenizer).
// Encoding:
//   1. Split the text on special tokens (control and user-defined tokens, longest match first)
//      when `parse_special` is set; each special token becomes its id.
//   2. Pre-tokenize each remaining span: the "smollm" variant first isolates every digit (\p{N});
//      then the GPT-2 pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|
//      \s+(?!\S)|\s+ cuts words. Unicode classes are exact for ASCII and tabulated for the main
//      scripts, symbol and punctuation blocks (tokenizer.cc lists the ranges).
//   3. Map each piece's UTF-8 bytes to GPT-2's printable byte alphabet (bytes_to_unicode).
//   4. BPE: repeatedly merge the adjacent pair with the lowest merge rank until none applies;
//      look the symbols up in the vocabulary (falling back to per-byte tokens).
// Decoding maps each token's text back through the inverse byte alphabet; control tokens are
// kept or skipped on request. `StreamDecoder` holds back an incomplete UTF-8 sequence between
// tokens so streamed text is always valid UTF-8 where the whole output is.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace splice {

class GgufFile;

enum class PreTokenizer : std::uint8_t { gpt2, smollm };
// Token kinds as GGUF numbers them (tokenizer.ggml.token_type).
enum class TokenKind : std::uint8_t {
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6
};

class Tokenizer {
 public:
  // GGUF metadata: tokenizer.ggml.model must be "gpt2"; tokens, merges, token_type, bos/eos ids,
  // add_bos_token; tokenizer.ggml.pre selects the pre-tokenizer ("smollm", or GPT-2's for
  // "gpt2"/"default"/absent); other values are an UnsupportedError naming them.
  static Tokenizer from_gguf(const GgufFile& file);
  // A Hugging Face tokenizer.json (path to the file or its directory).
  static Tokenizer from_json_file(const std::string& path);
  static Tokenizer from_json(const std::string& text, const std::string& source = "tokenizer.json");
  // From parts (tests, tools). `kinds` empty means all normal; merges are "left right" strings.
  static Tokenizer from_parts(std::vector<std::string> tokens,
                              const std::vector<std::string>& merges, std::vector<TokenKind> kinds,
                              PreTokenizer pre, std::optional<std::int32_t> bos_id = std::nullopt,
                              std::optional<std::int32_t> eos_id = std::nullopt);

  // A Hugging Face tokenizer.json (BPE model, this pre-tokenizer, ByteLevel decoder, control and
  // user-defined tokens as added tokens) that `tokenizers` and from_json load back.
  std::string to_json() const;

  std::vector<std::int32_t> encode(const std::string& text, bool parse_special = true) const;
  std::string decode(const std::vector<std::int32_t>& ids, bool skip_special = false) const;
  // The raw bytes one token stands for (a special token's text); ValueError for a bad id.
  std::string token_bytes(std::int32_t id) const;

  std::int64_t vocab_size() const { return static_cast<std::int64_t>(tokens_.size()); }
  const std::string& token(std::int32_t id) const;  // as stored (byte alphabet)
  TokenKind kind(std::int32_t id) const;
  std::optional<std::int32_t> find(const std::string& token) const;
  std::optional<std::int32_t> bos_id() const { return bos_id_; }
  std::optional<std::int32_t> eos_id() const { return eos_id_; }
  bool add_bos() const { return add_bos_; }
  PreTokenizer pre_tokenizer() const { return pre_; }

 private:
  static Tokenizer from_json_object(const nlohmann::json& j, const std::string& source);
  void build_indices();
  void encode_piece(const std::string& bytes, std::vector<std::int32_t>& out) const;
  void encode_plain(const std::string& text, std::vector<std::int32_t>& out) const;
  void check_id(std::int32_t id) const;

  std::vector<std::string> tokens_;
  std::vector<TokenKind> kinds_;
  std::unordered_map<std::string, std::int32_t> ids_;
  std::unordered_map<std::string, std::int32_t> merge_ranks_;  // "left right" -> rank
  std::vector<std::string> merges_;                            // in rank order
  std::vector<std::int32_t> byte_ids_;                         // byte value -> its token (-1)
  std::vector<std::int32_t> specials_;  // control/user-defined ids, longest text first
  PreTokenizer pre_ = PreTokenizer::gpt2;
  std::optional<std::int32_t> bos_id_, eos_id_;
  bool add_bos_ = false;
};

// Turns a stream of token ids into text pieces that never split a UTF-8 sequence.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}
  // The text that became complete with `id` (possibly empty).
  std::string push(std::int32_t id);
  // Whatever is left (an incomplete sequence at the end of the stream).
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace splice
