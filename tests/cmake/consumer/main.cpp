// The consumer that tests/cmake/install-and-consume.cmake builds with fusebox taken in by
// add_subdirectory and by FetchContent (conan/test_package is the find_package one). One compiled
// call, so the headers, xsimd, Hana and the thread pool all come through fusebox::fusebox; in the
// subdirectory form it also reads <fusebox/cpu.hpp> from a precompiled header that part.cpp's
// target made (fusebox_precompile_headers()). A static model needs only cpu.hpp (README), 5.3
// against 7.8 CPU-s for fusebox.hpp at -O1; the package form (conan/test_package) parses
// fusebox.hpp, every installed header.
#include <fusebox/cpu.hpp>
#include <fusebox/version.hpp>

#include <cstdio>

#ifdef CONSUMER_PART
float consumer_part_sum();  // part.cpp, in a second target
#endif

int main() {
  namespace fb = fusebox;
  fb::tensor<float, fb::shape<4, 8>> x;
  x.fill_random(1);
  auto f = fb::compile([](auto a) { return fb::relu(a) * 2.0f; });
  auto y = f(x);
  bool ok = true;
  for (std::size_t i = 0; i < 4; ++i)
    for (std::size_t j = 0; j < 8; ++j) ok = ok && y(i, j) == (x(i, j) > 0 ? x(i, j) * 2.0f : 0.0f);
#ifdef CONSUMER_PART
  ok = ok && consumer_part_sum() == 91.0f;
#endif
  std::printf("fusebox %s %s\n", fusebox::version_string, ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
