// Smallest program against the installed package: it must find the headers and their
// dependencies through fusebox::fusebox alone, and print the version it was built with.
#include <fusebox/fusebox.hpp>
#include <fusebox/version.hpp>

#include <cstdio>

int main() {
    std::printf("fusebox %s\n", fusebox::version_string);
    return 0;
}
