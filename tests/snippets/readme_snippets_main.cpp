// File: tests/snippets/readme_snippets_main.cpp
//
// The executable that links the README's snippets (readme_snippets.cpp, generated);
// it is built, not run: the snippets are checked by compiling and linking them.
int main() { return 0; }
