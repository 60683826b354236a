// splice CLI entry point; subcommands land as their issues do.
#include <iostream>
int main() { std::cout << "splice\n"; return 0; }
