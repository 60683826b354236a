// Byte-level BPE tokenizer (see tokenizer.h for the stages).
//
// Unicode classes for the GPT-2 pattern, by code point:
//   \s: the Unicode White_Space set (exact).
//   \p{N}: ASCII digits, Latin-1 superscripts and fractions, the decimal-digit blocks of the major
//          scripts, superscript/subscript digits, number forms, enclosed numbers, fullwidth digits.
//   \p{L}: ASCII letters and, above U+007F, everything not listed as \s, \p{N} or "other".
//   other: Latin-1 punctuation and symbols, combining marks, general punctuation, currency,
//          arrows/math/technical/box/shapes/dingbats, CJK punctuation, fullwidth punctuation,
//          private use, variation selectors, emoji and symbol planes, and invalid UTF-8 bytes.
#include "splice/model/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "splice/core/error.h"
#include "splice/model/gguf.h"

namespace splice {

namespace {

using Json = nlohmann::json;

constexpr std::uint32_t kInvalid = 0xFFFFFFFFu;
constexpr int kNumBytes = 256;
constexpr std::uint32_t kByteAlphabetShift = 256;  // unprintable bytes map to U+0100 + n
// Largest vocabulary accepted from a file (real ones are 10^4 - 10^6 tokens).
constexpr std::int64_t kMaxVocabSize = 1 << 24;

enum class CharClass : std::uint8_t { letter, number, space, other };

struct Range {
  std::uint32_t lo, hi;
};

constexpr Range kSpaces[] = {{0x09, 0x0D},     {0x20, 0x20},     {0x85, 0x85},     {0xA0, 0xA0},
                             {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F},
                             {0x205F, 0x205F}, {0x3000, 0x3000}};
constexpr Range kNumbers[] = {
    {0x30, 0x39},       {0xB2, 0xB3},       {0xB9, 0xB9},       {0xBC, 0xBE},
    {0x660, 0x669},     {0x6F0, 0x6F9},     {0x7C0, 0x7C9},     {0x966, 0x96F},
    {0x9E6, 0x9EF},     {0xA66, 0xA6F},     {0xAE6, 0xAEF},     {0xB66, 0xB6F},
    {0xBE6, 0xBF2},     {0xC66, 0xC6F},     {0xCE6, 0xCEF},     {0xD66, 0xD78},
    {0xE50, 0xE59},     {0xED0, 0xED9},     {0xF20, 0xF33},     {0x1040, 0x1049},
    {0x17E0, 0x17E9},   {0x1810, 0x1819},   {0x2070, 0x2070},   {0x2074, 0x2079},
    {0x2080, 0x2089},   {0x2150, 0x2189},   {0x2460, 0x249B},   {0x24EA, 0x24FF},
    {0x2776, 0x2793},   {0x3007, 0x3007},   {0x3021, 0x3029},   {0x3038, 0x303A},
    {0x3192, 0x3195},   {0x3220, 0x3229},   {0x3248, 0x324F},   {0x3251, 0x325F},
    {0x3280, 0x3289},   {0x32B1, 0x32BF},   {0xFF10, 0xFF19},   {0x1D7CE, 0x1D7FF},
    {0x1F100, 0x1F10C}, {0x1090, 0x1099},   {0x1369, 0x137C},   {0x16EE, 0x16F0},
    {0x1946, 0x194F},   {0x19D0, 0x19DA},   {0x1A80, 0x1A89},   {0x1A90, 0x1A99},
    {0x1B50, 0x1B59},   {0x1BB0, 0x1BB9},   {0x1C40, 0x1C49},   {0x1C50, 0x1C59},
    {0x2CFD, 0x2CFD},   {0xA620, 0xA629},   {0xA8D0, 0xA8D9},   {0xA900, 0xA909},
    {0xA9D0, 0xA9D9},   {0xA9F0, 0xA9F9},   {0xAA50, 0xAA59},   {0xABF0, 0xABF9},
    {0x10107, 0x10133}, {0x104A0, 0x104A9}, {0x11066, 0x1106F}, {0x1D360, 0x1D378},
    {0x1E950, 0x1E959},
};
constexpr Range kOthers[] = {
    {0x00, 0x08},       {0x0E, 0x1F},       {0x21, 0x2F},       {0x3A, 0x40},
    {0x5B, 0x60},       {0x7B, 0x84},       {0x86, 0x9F},       {0xA1, 0xA9},
    {0xAB, 0xB1},       {0xB4, 0xB4},       {0xB6, 0xB8},       {0xBB, 0xBB},
    {0xBF, 0xBF},       {0xD7, 0xD7},       {0xF7, 0xF7},       {0x2C2, 0x2C5},
    {0x2D2, 0x2DF},     {0x2E5, 0x2EB},     {0x2ED, 0x2ED},     {0x2EF, 0x36F},
    {0x375, 0x375},     {0x37E, 0x37E},     {0x384, 0x385},     {0x387, 0x387},
    {0x482, 0x489},     {0x55A, 0x55F},     {0x589, 0x58A},     {0x591, 0x5C7},
    {0x600, 0x61F},     {0x64B, 0x65F},     {0x66A, 0x66D},     {0x6D4, 0x6D4},
    {0x6D6, 0x6ED},     {0x900, 0x903},     {0x93A, 0x94F},     {0x951, 0x957},
    {0x962, 0x965},     {0x970, 0x970},     {0xE31, 0xE31},     {0xE34, 0xE3F},
    {0xE47, 0xE4F},     {0x2010, 0x2027},   {0x2030, 0x205E},   {0x2060, 0x206F},
    {0x200B, 0x200F},   {0x207A, 0x207E},   {0x208A, 0x208E},   {0x20A0, 0x20FF},
    {0x2100, 0x2101},   {0x2103, 0x2106},   {0x2108, 0x2109},   {0x2114, 0x2114},
    {0x2116, 0x2118},   {0x211E, 0x2123},   {0x2125, 0x2125},   {0x2127, 0x2127},
    {0x2129, 0x2129},   {0x212E, 0x212E},   {0x213A, 0x213B},   {0x2140, 0x2144},
    {0x214A, 0x214D},   {0x214F, 0x214F},   {0x218A, 0x245F},   {0x249C, 0x24E9},
    {0x2500, 0x2775},   {0x2794, 0x2BFF},   {0x2CE5, 0x2CEA},   {0x2CF9, 0x2CFF},
    {0x2E00, 0x2E7F},   {0x2E80, 0x2FFF},   {0x3001, 0x3004},   {0x3008, 0x3020},
    {0x302A, 0x3030},   {0x3036, 0x3037},   {0x303D, 0x303F},   {0x3099, 0x309C},
    {0x30A0, 0x30A0},   {0x30FB, 0x30FB},   {0x3190, 0x3191},   {0x3196, 0x319F},
    {0x31C0, 0x31EF},   {0x3200, 0x321F},   {0x322A, 0x3247},   {0x3250, 0x3250},
    {0x3260, 0x327F},   {0x328A, 0x32B0},   {0x32C0, 0x33FF},   {0x4DC0, 0x4DFF},
    {0xA490, 0xA4CF},   {0xD800, 0xF8FF},   {0xFB29, 0xFB29},   {0xFD3E, 0xFD3F},
    {0xFE00, 0xFE6F},   {0xFEFF, 0xFEFF},   {0xFF01, 0xFF0F},   {0xFF1A, 0xFF20},
    {0xFF3B, 0xFF40},   {0xFF5B, 0xFF65},   {0xFFE0, 0xFFFF},   {0x1D000, 0x1D24F},
    {0x1D300, 0x1D37F}, {0x1F000, 0x1F0FF}, {0x1F10D, 0x1FBFF}, {0xE0000, 0x10FFFF},
};

template <std::size_t N>
bool in(const Range (&ranges)[N], std::uint32_t cp) {
  for (const auto& r : ranges)
    if (cp >= r.lo && cp <= r.hi) return true;
  return false;
}

CharClass classify(std::uint32_t cp) {
  if (cp == kInvalid) return CharClass::other;
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::letter;
    if (cp >= '0' && cp <= '9') return CharClass::number;
    if (in(kSpaces, cp)) return CharClass::space;
    return CharClass::other;
  }
  if (in(kSpaces, cp)) return CharClass::space;
  if (in(kNumbers, cp)) return CharClass::number;
  if (in(kOthers, cp)) return CharClass::other;
  return CharClass::letter;
}

// Decodes the code point at `i`; an invalid or truncated sequence is one byte of kInvalid.
std::size_t next_codepoint(const std::string& s, std::size_t i, std::uint32_t* cp) {
  const auto b0 = static_cast<std::uint8_t>(s[i]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  std::size_t len = 0;
  std::uint32_t value = 0, min = 0;
  if ((b0 & 0xE0) == 0xC0)
    len = 2, value = b0 & 0x1F, min = 0x80;
  else if ((b0 & 0xF0) == 0xE0)
    len = 3, value = b0 & 0x0F, min = 0x800;
  else if ((b0 & 0xF8) == 0xF0)
    len = 4, value = b0 & 0x07, min = 0x10000;
  if (len == 0 || i + len > s.size()) {
    *cp = kInvalid;
    return 1;
  }
  for (std::size_t k = 1; k < len; ++k) {
    const auto b = static_cast<std::uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      *cp = kInvalid;
      return 1;
    }
    value = (value << 6) | (b & 0x3F);
  }
  if (value < min || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) {
    *cp = kInvalid;
    return 1;
  }
  *cp = value;
  return len;
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// GPT-2's bytes_to_unicode: printable bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for
// themselves, the other 68 bytes for U+0100 + n in byte order.
struct ByteAlphabet {
  std::string encoded[kNumBytes];                // byte -> UTF-8 of its stand-in code point
  std::int32_t decoded[2 * kByteAlphabetShift];  // stand-in code point -> byte, or -1
  ByteAlphabet() {
    std::fill(std::begin(decoded), std::end(decoded), -1);
    std::uint32_t next = 0;
    for (int b = 0; b < kNumBytes; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const std::uint32_t cp =
          printable ? static_cast<std::uint32_t>(b) : kByteAlphabetShift + next++;
      append_utf8(encoded[b], cp);
      decoded[cp] = b;
    }
  }
};

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet alphabet;
  return alphabet;
}

// Stage 2: the GPT-2 pattern over [begin, end) of `s`, appending pieces as [start, stop).
void gpt2_split(const std::string& s, std::size_t begin, std::size_t end,
                std::vector<std::pair<std::size_t, std::size_t>>& pieces) {
  auto cls_at = [&](std::size_t i, std::size_t* len) {
    std::uint32_t cp;
    *len = next_codepoint(s, i, &cp);
    return classify(cp);
  };
  auto run = [&](std::size_t i, CharClass c) {
    std::size_t len;
    while (i < end && cls_at(i, &len) == c) i += len;
    return i;
  };
  static const char* kContractions[] = {"s", "t", "re", "ve", "m", "ll", "d"};
  std::size_t i = begin;
  while (i < end) {
    // 's 't 're 've 'm 'll 'd
    if (s[i] == '\'') {
      bool matched = false;
      for (const char* suffix : kContractions) {
        const std::size_t n = std::char_traits<char>::length(suffix);
        if (i + 1 + n <= end && s.compare(i + 1, n, suffix) == 0) {
          pieces.emplace_back(i, i + 1 + n);
          i += 1 + n;
          matched = true;
          break;
        }
      }
      if (matched) continue;
    }
    std::size_t len;
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`
    std::size_t start = i, j = i;
    if (s[j] == ' ' && j + 1 < end) ++j;
    CharClass c = cls_at(j, &len);
    if (c != CharClass::space) {
      const std::size_t stop = run(j, c);
      pieces.emplace_back(start, stop);
      i = stop;
      continue;
    }
    // `\s+(?!\S)` then `\s+`: a whitespace run leaves its last character to the next word.
    std::size_t stop = i, last = i;
    while (stop < end && cls_at(stop, &len) == CharClass::space) {
      last = stop;
      stop += len;
    }
    if (stop < end && last > i) stop = last;
    pieces.emplace_back(i, stop);
    i = stop;
  }
}

std::string read_text_file(const std::string& path, const char* default_name) {
  std::filesystem::path file(path);
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) file /= default_name;
  std::ifstream in(file, std::ios::binary);
  if (!in) fail<IoError>(file.string(), ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

Tokenizer Tokenizer::from_parts(std::vector<std::string> tokens,
                                const std::vector<std::string>& merges,
                                std::vector<TokenKind> kinds, PreTokenizer pre,
                                std::optional<std::int32_t> bos_id,
                                std::optional<std::int32_t> eos_id) {
  if (tokens.empty()) fail<ValueError>("tokenizer: the vocabulary is empty");
  if (tokens.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    fail<ValueError>("tokenizer: the vocabulary has too many tokens");
  if (!kinds.empty() && kinds.size() != tokens.size())
    fail<ValueError>("tokenizer: ", kinds.size(), " token kinds for ", tokens.size(), " tokens");
  Tokenizer t;
  t.tokens_ = std::move(tokens);
  t.kinds_ = kinds.empty() ? std::vector<TokenKind>(t.tokens_.size(), TokenKind::normal)
                           : std::move(kinds);
  t.pre_ = pre;
  for (std::size_t r = 0; r < merges.size(); ++r) {
    const std::string& m = merges[r];
    const std::size_t space = m.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == m.size() ||
        m.find(' ', space + 1) != std::string::npos)
      fail<ValueError>("tokenizer: merge ", r, " must be two symbols separated by one space, got '",
                       m, "'");
    t.merge_ranks_.emplace(m, static_cast<std::int32_t>(r));  // the first rank of a repeat wins
  }
  t.merges_ = merges;
  t.bos_id_ = bos_id;
  t.eos_id_ = eos_id;
  for (auto id : {bos_id, eos_id})
    if (id) t.check_id(*id);
  t.build_indices();
  return t;
}

void Tokenizer::build_indices() {
  ids_.clear();
  ids_.reserve(tokens_.size());
  for (std::size_t id = 0; id < tokens_.size(); ++id)
    ids_.emplace(tokens_[id], static_cast<std::int32_t>(id));  // the first id of a repeat wins
  const ByteAlphabet& alphabet = byte_alphabet();
  byte_ids_.assign(kNumBytes, -1);
  for (int b = 0; b < kNumBytes; ++b) {
    auto it = ids_.find(alphabet.encoded[b]);
    if (it != ids_.end()) byte_ids_[static_cast<std::size_t>(b)] = it->second;
  }
  specials_.clear();
  for (std::size_t id = 0; id < tokens_.size(); ++id)
    if ((kinds_[id] == TokenKind::control || kinds_[id] == TokenKind::user_defined) &&
        !tokens_[id].empty())
      specials_.push_back(static_cast<std::int32_t>(id));
  std::stable_sort(specials_.begin(), specials_.end(), [&](std::int32_t a, std::int32_t b) {
    return tokens_[static_cast<std::size_t>(a)].size() >
           tokens_[static_cast<std::size_t>(b)].size();
  });
}

Tokenizer Tokenizer::from_gguf(const GgufFile& file) {
  const std::string model = file.get_string("tokenizer.ggml.model");
  if (model != "gpt2")
    fail<UnsupportedError>(file.path(), ": tokenizer.ggml.model '", model,
                           "' is not supported (supported: gpt2, byte-level BPE)");
  const std::string pre_name = file.get_string("tokenizer.ggml.pre", std::string("default"));
  PreTokenizer pre;
  if (pre_name == "smollm")
    pre = PreTokenizer::smollm;
  else if (pre_name == "gpt2" || pre_name == "default")
    pre = PreTokenizer::gpt2;
  else
    fail<UnsupportedError>(file.path(), ": tokenizer.ggml.pre '", pre_name,
                           "' is not supported (supported: smollm, gpt2, default)");
  std::vector<std::string> tokens = file.get_string_array("tokenizer.ggml.tokens");
  std::vector<TokenKind> kinds;
  if (file.has_key("tokenizer.ggml.token_type")) {
    const auto types = file.get_int_array("tokenizer.ggml.token_type");
    if (types.size() != tokens.size())
      fail<IoError>(file.path(), ": tokenizer.ggml.token_type has ", types.size(), " entries for ",
                    tokens.size(), " tokens");
    for (auto type : types) {
      if (type < static_cast<int>(TokenKind::normal) || type > static_cast<int>(TokenKind::byte))
        fail<IoError>(file.path(), ": tokenizer.ggml.token_type value ", type, " is unknown");
      kinds.push_back(static_cast<TokenKind>(type));
    }
  }
  const std::vector<std::string> merges = file.get_string_array("tokenizer.ggml.merges");
  auto id_of = [&](const char* key) -> std::optional<std::int32_t> {
    if (!file.has_key(key)) return std::nullopt;
    return static_cast<std::int32_t>(file.get_int(key));
  };
  Tokenizer t =
      from_parts(std::move(tokens), merges, std::move(kinds), pre,
                 id_of("tokenizer.ggml.bos_token_id"), id_of("tokenizer.ggml.eos_token_id"));
  t.add_bos_ = file.get_bool("tokenizer.ggml.add_bos_token", false);
  return t;
}

Tokenizer Tokenizer::from_json(const std::string& text, const std::string& source) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    fail<IoError>(source, ": not valid JSON: ", e.what());
  }
  // A field of an unexpected JSON type surfaces from nlohmann as a type error: report it as the
  // malformed file it is.
  try {
    return from_json_object(j, source);
  } catch (const Json::exception& e) {
    fail<IoError>(source, ": malformed tokenizer: ", e.what());
  }
}

Tokenizer Tokenizer::from_json_object(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    fail<IoError>(source, ": must be an object with a `model` object");
  const Json& model = j["model"];
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE")
    fail<UnsupportedError>(source, ": model type '", type, "' is not supported (supported: BPE)");
  if (!model.contains("vocab") || !model["vocab"].is_object())
    fail<IoError>(source, ": `model.vocab` must be an object of token -> id");
  // Pre-tokenizer: ByteLevel (GPT-2), or Sequence[Digits(individual), ByteLevel] (SmolLM).
  PreTokenizer pre = PreTokenizer::gpt2;
  const Json& pt = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : Json();
  auto is_byte_level = [](const Json& p) {
    return p.is_object() && p.value("type", "") == "ByteLevel";
  };
  if (is_byte_level(pt)) {
    pre = PreTokenizer::gpt2;
  } else if (pt.is_object() && pt.value("type", "") == "Sequence" && pt.contains("pretokenizers") &&
             pt["pretokenizers"].is_array() && pt["pretokenizers"].size() == 2 &&
             pt["pretokenizers"][0].value("type", "") == "Digits" &&
             pt["pretokenizers"][0].value("individual_digits", false) &&
             is_byte_level(pt["pretokenizers"][1])) {
    pre = PreTokenizer::smollm;
  } else {
    fail<UnsupportedError>(source, ": pre_tokenizer ", pt.dump(),
                           " is not supported (supported: ByteLevel, Sequence[Digits(individual), "
                           "ByteLevel])");
  }
  // Ids index dense tables, so a hostile id must not size them: cap at kMaxVocabSize.
  auto checked_id = [&](const Json& value, const std::string& what) {
    const bool ok = value.is_number_integer() &&
                    !(value.is_number_unsigned() && value.get<std::uint64_t>() >= kMaxVocabSize) &&
                    value.get<std::int64_t>() >= 0 && value.get<std::int64_t>() < kMaxVocabSize;
    if (!ok)
      fail<IoError>(source, ": ", what, " must be an integer in [0, ", kMaxVocabSize, "), got ",
                    value.dump());
    return value.get<std::int64_t>();
  };
  std::int64_t size = 0;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it)
    size = std::max(size, checked_id(it.value(), "vocab id of '" + it.key() + "'") + 1);
  const Json added = j.contains("added_tokens") && j["added_tokens"].is_array() ? j["added_tokens"]
                                                                                : Json::array();
  for (const auto& a : added) {
    if (!a.is_object() || !a.contains("id") || !a.contains("content") || !a["content"].is_string())
      fail<IoError>(source, ": `added_tokens` entries need an `id` and a `content`, got ",
                    a.dump());
    size = std::max(size, checked_id(a["id"], "added token id") + 1);
  }
  std::vector<std::string> tokens(static_cast<std::size_t>(size));
  std::vector<TokenKind> kinds(static_cast<std::size_t>(size), TokenKind::unused);
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    const auto id = static_cast<std::size_t>(it.value().get<std::int64_t>());
    tokens[id] = it.key();
    kinds[id] = TokenKind::normal;
  }
  for (const auto& a : added) {
    if (!a.contains("id") || !a["id"].is_number_integer() || a["id"].get<std::int64_t>() < 0 ||
        !a.contains("content") || !a["content"].is_string())
      fail<IoError>(source, ": `added_tokens` entries need an `id` and a `content`, got ",
                    a.dump());
    const auto id = static_cast<std::size_t>(a["id"].get<std::int64_t>());
    tokens[id] = a["content"].get<std::string>();
    kinds[id] = a.value("special", false) ? TokenKind::control : TokenKind::user_defined;
  }
  std::vector<std::string> merges;
  if (model.contains("merges") && model["merges"].is_array()) {
    for (const auto& m : model["merges"]) {
      if (m.is_string())
        merges.push_back(m.get<std::string>());
      else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
        merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
      else
        fail<IoError>(source, ": `model.merges` entries must be \"a b\" or [a, b], got ", m.dump());
    }
  }
  return from_parts(std::move(tokens), merges, std::move(kinds), pre);
}

Tokenizer Tokenizer::from_json_file(const std::string& path) {
  std::filesystem::path file(path);
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) file /= "tokenizer.json";
  return from_json(read_text_file(file.string(), "tokenizer.json"), file.string());
}

std::string Tokenizer::to_json() const {
  Json vocab = Json::object();
  Json added = Json::array();
  for (std::size_t id = 0; id < tokens_.size(); ++id) {
    const TokenKind k = kinds_[id];
    if (k == TokenKind::control || k == TokenKind::user_defined) {
      added.push_back({{"id", id},
                       {"content", tokens_[id]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", k == TokenKind::user_defined},
                       {"special", k == TokenKind::control}});
    }
    vocab[tokens_[id]] = id;
  }
  Json merges = Json::array();
  for (const auto& m : merges_) {
    const std::size_t space = m.find(' ');
    merges.push_back({m.substr(0, space), m.substr(space + 1)});
  }
  const Json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", true}};
  Json pre = byte_level;
  if (pre_ == PreTokenizer::smollm)
    pre = {{"type", "Sequence"},
           {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level}}};
  Json j = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", added},
            {"normalizer", nullptr},
            {"pre_tokenizer", pre},
            {"post_processor", nullptr},
            {"decoder", byte_level},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", nullptr},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"fuse_unk", false},
              {"byte_fallback", false},
              {"ignore_merges", false},
              {"vocab", vocab},
              {"merges", merges}}}};
  return j.dump();
}

void Tokenizer::check_id(std::int32_t id) const {
  if (id < 0 || id >= static_cast<std::int32_t>(tokens_.size()))
    fail<ValueError>("token id ", id, " is out of range [0, ", tokens_.size(), ")");
}

const std::string& Tokenizer::token(std::int32_t id) const {
  check_id(id);
  return tokens_[static_cast<std::size_t>(id)];
}

TokenKind Tokenizer::kind(std::int32_t id) const {
  check_id(id);
  return kinds_[static_cast<std::size_t>(id)];
}

std::optional<std::int32_t> Tokenizer::find(const std::string& token) const {
  auto it = ids_.find(token);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

// Stages 3-4 for one pre-tokenized piece (raw bytes).
void Tokenizer::encode_piece(const std::string& bytes, std::vector<std::int32_t>& out) const {
  const ByteAlphabet& alphabet = byte_alphabet();
  std::vector<std::string> symbols;
  symbols.reserve(bytes.size());
  for (unsigned char b : bytes) symbols.push_back(alphabet.encoded[b]);
  std::string key;
  while (symbols.size() > 1) {
    std::int32_t best_rank = std::numeric_limits<std::int32_t>::max();
    std::size_t best = 0;
    for (std::size_t k = 0; k + 1 < symbols.size(); ++k) {
      key.assign(symbols[k]).append(" ").append(symbols[k + 1]);
      auto it = merge_ranks_.find(key);
      if (it != merge_ranks_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = k;
      }
    }
    if (best_rank == std::numeric_limits<std::int32_t>::max()) break;
    symbols[best] += symbols[best + 1];
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  for (const auto& s : symbols) {
    auto it = ids_.find(s);
    if (it != ids_.end()) {
      out.push_back(it->second);
      continue;
    }
    // Not in the vocabulary: one token per byte of the symbol.
    std::uint32_t cp;
    for (std::size_t k = 0; k < s.size();) {
      k += next_codepoint(s, k, &cp);
      const std::int32_t b = cp < 2 * kByteAlphabetShift ? alphabet.decoded[cp] : -1;
      if (b < 0 || byte_ids_[static_cast<std::size_t>(b)] < 0)
        fail<ValueError>("tokenizer: symbol '", s, "' has no token and no byte fallback");
      out.push_back(byte_ids_[static_cast<std::size_t>(b)]);
    }
  }
}

void Tokenizer::encode_plain(const std::string& text, std::vector<std::int32_t>& out) const {
  std::vector<std::pair<std::size_t, std::size_t>> pieces;
  if (pre_ == PreTokenizer::smollm) {
    // \p{N}: each digit is its own piece; the text between digits goes through GPT-2's pattern.
    std::size_t start = 0, i = 0;
    while (i < text.size()) {
      std::uint32_t cp;
      const std::size_t len = next_codepoint(text, i, &cp);
      if (classify(cp) == CharClass::number) {
        if (i > start) gpt2_split(text, start, i, pieces);
        pieces.emplace_back(i, i + len);
        start = i + len;
      }
      i += len;
    }
    if (start < text.size()) gpt2_split(text, start, text.size(), pieces);
  } else {
    gpt2_split(text, 0, text.size(), pieces);
  }
  for (const auto& [a, b] : pieces) encode_piece(text.substr(a, b - a), out);
}

std::vector<std::int32_t> Tokenizer::encode(const std::string& text, bool parse_special) const {
  std::vector<std::int32_t> out;
  if (!parse_special || specials_.empty()) {
    encode_plain(text, out);
    return out;
  }
  // Stage 1: special tokens, longest first at each position.
  std::size_t start = 0, i = 0;
  while (i < text.size()) {
    std::int32_t hit = -1;
    for (std::int32_t id : specials_) {
      const std::string& s = tokens_[static_cast<std::size_t>(id)];
      if (text.compare(i, s.size(), s) == 0) {
        hit = id;
        break;
      }
    }
    if (hit < 0) {
      ++i;
      continue;
    }
    if (i > start) encode_plain(text.substr(start, i - start), out);
    out.push_back(hit);
    i += tokens_[static_cast<std::size_t>(hit)].size();
    start = i;
  }
  if (start < text.size()) encode_plain(text.substr(start), out);
  return out;
}

std::string Tokenizer::token_bytes(std::int32_t id) const {
  check_id(id);
  const std::string& t = tokens_[static_cast<std::size_t>(id)];
  const TokenKind k = kinds_[static_cast<std::size_t>(id)];
  if (k == TokenKind::control || k == TokenKind::user_defined) return t;
  const ByteAlphabet& alphabet = byte_alphabet();
  std::string out;
  std::uint32_t cp;
  for (std::size_t i = 0; i < t.size();) {
    const std::size_t len = next_codepoint(t, i, &cp);
    const std::int32_t b = cp < 2 * kByteAlphabetShift ? alphabet.decoded[cp] : -1;
    if (b >= 0)
      out.push_back(static_cast<char>(b));
    else
      out.append(t, i, len);  // not in the byte alphabet: kept as written
    i += len;
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<std::int32_t>& ids, bool skip_special) const {
  std::string out;
  for (std::int32_t id : ids) {
    if (skip_special && kind(id) == TokenKind::control) continue;
    out += token_bytes(id);
  }
  return out;
}

std::string StreamDecoder::push(std::int32_t id) {
  if (skip_special_ && tokenizer_.kind(id) == TokenKind::control) return "";
  pending_ += tokenizer_.token_bytes(id);
  // Emit everything up to the start of a trailing incomplete UTF-8 sequence.
  std::size_t keep = 0;
  const std::size_t n = pending_.size();
  for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto b = static_cast<std::uint8_t>(pending_[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const std::size_t need = (b & 0xE0) == 0xC0   ? 2
                             : (b & 0xF0) == 0xE0 ? 3
                             : (b & 0xF8) == 0xF0 ? 4
                                                  : 1;
    if (need > back) keep = back;
    break;
  }
  std::string ready = pending_.substr(0, n - keep);
  pending_.erase(0, n - keep);
  return ready;
}

std::string StreamDecoder::flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

}  // namespace splice
