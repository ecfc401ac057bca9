// examples/edge_fashion_cnn.cpp: the T2 CNN that examples/train_fashion_mnist.cpp trains, deployed
// the edge way (issue 23): the same fusebox source, built from <fusebox/cpu.hpp> without exceptions,
// RTTI, threads of fusebox's own or the environment (FUSEBOX_NO_THREADS, FUSEBOX_NO_ENVIRONMENT),
// its weights in the program's own arrays and frozen (options::freezing), the compiled function's
// memory sized at compile time. It reads a safetensors checkpoint, classifies the Fashion-MNIST test set one image at a
// time (batch 1, as a device sees its inputs) and prints the accuracy, the memory it uses and the
// heap allocations after start (0).
//
//   train_fashion_mnist --model cnn --save t2.safetensors
//   gunzip -k t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz   # into DIR
//   edge_fashion_cnn t2.safetensors DIR [LIMIT]
//
// Files are read with the C library (an edge build links no std::filesystem). A checkpoint whose
// tensor names, shapes or dtypes do not fit the model is an error naming the tensor and both
// shapes, and no weight is written unless every one fits (io/safetensors.hpp).
#include <fusebox/cpu.hpp>
#include <fusebox/io/safetensors.hpp>
#include <fusebox/nn/parameters.hpp>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

// Every heap allocation, counted: what the program allocates after its start must be nothing.
namespace {
std::atomic<long> heap_allocations{0};
}
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"  // free() of what this operator new returned
void* operator new(std::size_t n) {
  heap_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  std::fputs("edge_fashion_cnn: out of memory\n", stderr);
  std::abort();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace {

namespace fb = fusebox;

// The weights, in the program's own memory (names as train_fashion_mnist saves them: torch's
// nn.Sequential indices of conv 0, conv 3 and linear 7).
alignas(64) float conv1_w[32 * 1 * 5 * 5];
alignas(64) float conv1_b[32];
alignas(64) float conv2_w[64 * 32 * 5 * 5];
alignas(64) float conv2_b[64];
alignas(64) float linear_w[10 * 1024];
alignas(64) float linear_b[10];
alignas(64) float image[1 * 1 * 28 * 28];
alignas(64) float logits[1 * 10];

/// The network of examples/fashion_cnn.hpp at batch 1; linear weights are torch's [out, in].
constexpr auto t2_cnn = [](auto x, auto w1, auto b1, auto w2, auto b2, auto w3, auto b3) {
  const auto h1 = fb::max_pool2d<2>(fb::relu(fb::conv2d(x, w1, b1)));
  const auto h2 = fb::max_pool2d<2>(fb::relu(fb::conv2d(h1, w2, b2)));
  return fb::linear(fb::reshape<fb::shape<1, 1024>>(h2), w3, b3);
};

/// The whole of a file, or an empty vector (with a message) when it cannot be read.
std::vector<std::byte> read_file(const std::string& path) {
  std::vector<std::byte> bytes;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    std::fprintf(stderr, "edge_fashion_cnn: cannot open %s\n", path.c_str());
    return bytes;
  }
  std::byte chunk[1 << 16];
  for (std::size_t n; (n = std::fread(chunk, 1, sizeof chunk, f)) > 0;) bytes.insert(bytes.end(), chunk, chunk + n);
  std::fclose(f);
  return bytes;
}

/// A big-endian 32-bit word of an IDX file.
std::uint32_t be32(const std::byte* p) {
  return std::uint32_t(p[0]) << 24 | std::uint32_t(p[1]) << 16 | std::uint32_t(p[2]) << 8 | std::uint32_t(p[3]);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s CHECKPOINT.safetensors DIR [LIMIT]\n"
                         "  DIR holds t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte (uncompressed)\n", argv[0]);
    return 2;
  }
  const std::string checkpoint = argv[1], dir = argv[2];

  // Start: the tensors over the program's arrays, the weights loaded, the test set read.
  auto w1 = fb::tensor<float, fb::shape<32, 1, 5, 5>>::over(conv1_w);
  auto b1 = fb::tensor<float, fb::shape<32>>::over(conv1_b);
  auto w2 = fb::tensor<float, fb::shape<64, 32, 5, 5>>::over(conv2_w);
  auto b2 = fb::tensor<float, fb::shape<64>>::over(conv2_b);
  auto w3 = fb::tensor<float, fb::shape<10, 1024>>::over(linear_w);
  auto b3 = fb::tensor<float, fb::shape<10>>::over(linear_b);
  auto x = fb::tensor<float, fb::shape<1, 1, 28, 28>>::over(image);
  auto y = fb::tensor<float, fb::shape<1, 10>>::over(logits);
  {
    fb::nn::parameter_list<float> params;
    params.add("0.weight", w1);
    params.add("0.bias", b1);
    params.add("3.weight", w2);
    params.add("3.bias", b2);
    params.add("7.weight", w3);
    params.add("7.bias", b3);
    const std::vector<std::byte> bytes = read_file(checkpoint);
    if (bytes.empty()) return 1;
    fb::io::load_safetensors(fb::io::parse_safetensors(bytes, checkpoint), checkpoint, params);
  }
  const std::vector<std::byte> images = read_file(dir + "/t10k-images-idx3-ubyte");
  const std::vector<std::byte> labels = read_file(dir + "/t10k-labels-idx1-ubyte");
  if (images.size() < 16 || labels.size() < 8 || be32(images.data()) != 0x803 || be32(labels.data()) != 0x801 ||
      be32(images.data() + 8) != 28 || be32(images.data() + 12) != 28) {
    std::fprintf(stderr, "edge_fashion_cnn: %s does not hold the uncompressed Fashion-MNIST test set\n", dir.c_str());
    return 1;
  }
  std::size_t count = std::min<std::size_t>(be32(images.data() + 4), be32(labels.data() + 4));
  if (argc > 3) count = std::min<std::size_t>(count, std::strtoul(argv[3], nullptr, 10));
  if (images.size() < 16 + count * 784 || labels.size() < 8 + count) {
    std::fprintf(stderr, "edge_fashion_cnn: the test set files are truncated\n");
    return 1;
  }

  // The weights captured and frozen (options::freezing, as XNNPACK's static weights): what the
  // kernels make of them (the second convolution's Winograd-transformed weights) is made at the
  // first image and kept, in the static memory with the arena and the workspace.
  auto net = fb::compile<fb::options{.freezing = true}>([&](auto xi) { return t2_cnn(xi, w1, b1, w2, b2, w3, b3); });
  static fb::static_memory<decltype(net), 1, decltype(x)> memory;
  net.use_memory(memory.span());

  // After start: one image at a time, nothing allocated.
  const long allocations_at_start = heap_allocations.load();
  std::size_t correct = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::byte* pixels = images.data() + 16 + i * 784;
    for (std::size_t p = 0; p < 784; ++p) image[p] = static_cast<float>(pixels[p]) / 255.0f;  // as the loader scales
    net.run(y, x);
    std::size_t best = 0;
    for (std::size_t k = 1; k < 10; ++k)
      if (logits[k] > logits[best]) best = k;
    correct += best == static_cast<std::size_t>(labels[8 + i]);
  }
  const long allocations_after_start = heap_allocations.load() - allocations_at_start;

  const std::size_t weight_bytes = sizeof conv1_w + sizeof conv1_b + sizeof conv2_w + sizeof conv2_b + sizeof linear_w +
                                   sizeof linear_b;
  std::printf("T2 CNN, batch 1, %s: accuracy %.2f%% on %zu test images\n",
#if defined(__aarch64__)
              "aarch64",
#else
              "x86-64",
#endif
              100.0 * static_cast<double>(correct) / static_cast<double>(count), count);
  std::printf("memory: weights %zu bytes, arena + frozen weights + workspace %zu bytes (static_memory), input and "
              "output %zu bytes\n",
              weight_bytes, memory.size, sizeof image + sizeof logits);
  std::printf("heap allocations after start: %ld\n", allocations_after_start);
  return allocations_after_start == 0 ? 0 : 1;
}
