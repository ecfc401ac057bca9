// fusebox/data/fashion_mnist.hpp: loads Fashion-MNIST (or MNIST: same files, same format) from a
// directory into float images in [0, 1] and int labels, ready to be a loader's dataset.
//
// The default directory is where Debian's package dataset-fashion-mnist installs the four files
// (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz,
// t10k-labels-idx1-ubyte.gz); the same names without .gz are accepted too. Besides read_idx's
// checks, the images must be uint8 [n, rows, cols], the labels uint8 [n] with the same n, and
// every label in 0..9.
//
// Depends on: the C++20 standard library, fusebox/core/errors.hpp, fusebox/data/idx.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fusebox/core/errors.hpp"
#include "fusebox/data/idx.hpp"

namespace fusebox::data {

inline constexpr const char* fashion_mnist_default_dir = "/usr/share/datasets/fashion-mnist/";

/// Labelled images, one after the other, row-major. A map-style dataset: get(i) is the i-th
/// image (a view into `images`) and its label.
struct image_set {
  std::size_t count = 0, rows = 0, cols = 0;
  std::vector<float> images;          // count * rows * cols values in [0, 1]
  std::vector<std::int32_t> labels;   // count values

  std::size_t size() const noexcept { return count; }
  std::pair<std::span<const float>, std::int32_t> get(std::size_t i) const {
    return {std::span<const float>(images).subspan(i * rows * cols, rows * cols), labels[i]};
  }
};

struct fashion_mnist {
  image_set train;  // 60000 images of 28 x 28
  image_set test;   // 10000
};

namespace detail {

inline image_set load_image_set(const std::filesystem::path& images_file,
                                const std::filesystem::path& labels_file) {
  const idx_array images = read_idx(images_file);
  const idx_array labels = read_idx(labels_file);
  if (images.type() != idx_type::uint8 || images.extents.size() != 3)
    FUSEBOX_THROW(invalid_argument("fusebox: '" + images_file.string() + "' holds " +
                                   images.extents_text() + " " + idx_type_name(images.type()) +
                                   " values; Fashion-MNIST images are uint8 [count x rows x cols]"));
  if (labels.type() != idx_type::uint8 || labels.extents.size() != 1 ||
      labels.extents[0] != images.extents[0])
    FUSEBOX_THROW(invalid_argument("fusebox: '" + labels_file.string() + "' holds " +
                                   labels.extents_text() + " " + idx_type_name(labels.type()) +
                                   " values; expected " + std::to_string(images.extents[0]) +
                                   " uint8 labels, one per image of '" + images_file.string() + "'"));

  image_set set;
  set.count = images.extents[0];
  set.rows = images.extents[1];
  set.cols = images.extents[2];
  const auto& pixels = images.as<std::uint8_t>();
  set.images.resize(pixels.size());
  for (std::size_t i = 0; i < pixels.size(); ++i) set.images[i] = pixels[i] / 255.0f;
  const auto& classes = labels.as<std::uint8_t>();
  set.labels.resize(classes.size());
  for (std::size_t i = 0; i < classes.size(); ++i) {
    if (classes[i] > 9)
      FUSEBOX_THROW(invalid_argument("fusebox: '" + labels_file.string() + "': label " +
                                     std::to_string(i) + " is " + std::to_string(classes[i]) +
                                     "; Fashion-MNIST labels are 0..9"));
    set.labels[i] = classes[i];
  }
  return set;
}

}  // namespace detail

/// Loads the training and test sets from `dir`. If a file is missing (as `name.gz` and as
/// `name`), the error names the directory, every missing file and the Debian package.
inline fashion_mnist load_fashion_mnist(
    const std::filesystem::path& dir = fashion_mnist_default_dir) {
  const char* names[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                         "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
  std::filesystem::path files[4];
  std::string missing;
  for (int k = 0; k < 4; ++k) {
    std::error_code ec;
    const auto gz = dir / (std::string(names[k]) + ".gz");
    if (std::filesystem::exists(gz, ec)) {
      files[k] = gz;
    } else if (std::filesystem::exists(dir / names[k], ec)) {
      files[k] = dir / names[k];
    } else {
      missing += (missing.empty() ? "" : ", ") + gz.filename().string();
    }
  }
  if (!missing.empty())
    FUSEBOX_THROW(invalid_argument("fusebox: Fashion-MNIST not found in '" + dir.string() +
                                   "': missing " + missing +
                                   ". Install Debian's package dataset-fashion-mnist (apt-get install "
                                   "dataset-fashion-mnist), or pass the directory that holds the files "
                                   "from https://github.com/zalandoresearch/fashion-mnist"));
  return {detail::load_image_set(files[0], files[1]), detail::load_image_set(files[2], files[3])};
}

}  // namespace fusebox::data
