// The image transforms against torchvision 0.14: tests/python/torchvision_reference.py writes a
// test image and torchvision's tensor-path output of each deterministic transform; ours must be
// identical (uint8) or within 1e-6 (float). The random transforms draw from the same
// distributions (RandomResizedCrop's parameters: two-sample Kolmogorov-Smirnov against 20,000
// draws of torchvision's get_params), and the seeding gives the same augmentations for the same
// (seed, epoch, key) and others for another epoch.
#include "worker/data/image_transforms.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "tests/test_support.h"

namespace dtrain {
namespace image_transforms_test {

using ::dtrain::testing::CommandResult;
using ::dtrain::testing::ProcessTempDir;
using ::dtrain::testing::ReadFile;
using ::dtrain::testing::RunShell;
using ::testing::HasSubstr;
using v1::ImageTransform;

class ImageTransformsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(ProcessTempDir() + "/transforms-reference");
    CommandResult made = RunShell(absl::StrCat("/usr/bin/python3 " DTRAIN_SOURCE_DIR
                                               "/tests/python/torchvision_reference.py transforms ",
                                               *dir_, " 2>&1"));
    ASSERT_EQ(made.exit_code, 0) << made.output;
    refs_ = new std::map<std::string, at::Tensor>();
    std::ifstream manifest(*dir_ + "/manifest.txt");
    std::string name, dtype;
    int64_t c, h, w;
    while (manifest >> name >> dtype >> c >> h >> w) {
      const std::string bytes =
          ReadFile(*dir_ + "/" + (name == "input" ? std::string("input.rgb") : name + ".bin"));
      const at::ScalarType type = dtype == "uint8" ? at::kByte : at::kFloat;
      ASSERT_EQ(bytes.size(), static_cast<size_t>(c * h * w) * at::elementSize(type)) << name;
      (*refs_)[name] =
          at::from_blob(const_cast<char*>(bytes.data()), {c, h, w}, at::TensorOptions(type))
              .clone();
    }
    // input.rgb is HWC: the manifest gives its size as (3, H, W).
    at::Tensor& input = (*refs_)["input"];
    input = input.reshape({input.size(1), input.size(2), 3});
  }

  static const at::Tensor& Ref(const std::string& name) { return refs_->at(name); }
  // The test image as decoded pixels (what DecodeImage would give).
  static DecodedImage Input() {
    const at::Tensor& hwc = Ref("input");
    DecodedImage image;
    image.height = static_cast<int>(hwc.size(0));
    image.width = static_cast<int>(hwc.size(1));
    image.channels = 3;
    image.pixels.assign(hwc.data_ptr<uint8_t>(), hwc.data_ptr<uint8_t>() + hwc.numel());
    return image;
  }
  static at::Tensor InputChw() { return Ref("input").permute({2, 0, 1}); }

  static ImageTransformPipeline Pipeline(const std::string& text) {
    google::protobuf::RepeatedPtrField<ImageTransform> list;
    v1::DataTransforms transforms;
    EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &transforms)) << text;
    absl::StatusOr<ImageTransformPipeline> pipeline =
        ImageTransformPipeline::Create(transforms.train(), "transforms.train");
    EXPECT_TRUE(pipeline.ok()) << pipeline.status();
    return *std::move(pipeline);
  }
  static absl::Status CreateError(const std::string& text) {
    v1::DataTransforms transforms;
    EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &transforms)) << text;
    return ImageTransformPipeline::Create(transforms.train(), "transforms.train").status();
  }

  static std::string* dir_;
  static std::map<std::string, at::Tensor>* refs_;
};
std::string* ImageTransformsTest::dir_ = nullptr;
std::map<std::string, at::Tensor>* ImageTransformsTest::refs_ = nullptr;

void ExpectIdentical(const at::Tensor& ours, const at::Tensor& theirs, const std::string& name) {
  ASSERT_EQ(ours.sizes(), theirs.sizes()) << name;
  ASSERT_EQ(ours.scalar_type(), theirs.scalar_type()) << name;
  if (theirs.scalar_type() == at::kByte) {
    const int64_t differing = at::ne(ours, theirs).sum().item<int64_t>();
    EXPECT_EQ(differing, 0) << name << ": max abs diff "
                            << at::abs(ours.to(at::kInt) - theirs.to(at::kInt)).max().item<int>();
  } else {
    const double diff = at::abs(ours - theirs).max().item<double>();
    EXPECT_LE(diff, 1e-6) << name;
  }
}

TEST_F(ImageTransformsTest, DeterministicOps_EqualTorchvision) {
  namespace ops = image_ops;
  const at::Tensor x = InputChw();  // 3 x 83 x 61
  const auto bilinear = ImageTransform::INTERPOLATION_BILINEAR;
  const auto constant = ImageTransform::PADDING_MODE_CONSTANT;
  ExpectIdentical(ops::Resize(x, 33, 50, bilinear, true), Ref("resize_33x50"), "resize_33x50");
  ExpectIdentical(ops::Resize(x, 150, 120, bilinear, true), Ref("resize_up_150x120"),
                  "resize_up_150x120");
  ExpectIdentical(ops::Resize(ops::ToFloat(x), 33, 50, bilinear, true), Ref("resize_float_33x50"),
                  "resize_float_33x50");
  ExpectIdentical(ops::CenterCrop(x, 30, 20), Ref("center_crop_30x20"), "center_crop_30x20");
  ExpectIdentical(ops::CenterCrop(x, 90, 70), Ref("center_crop_90x70"), "center_crop_90x70");
  ExpectIdentical(ops::Crop(ops::Pad(x, 4, 4, 4, 4, 0, constant), 3, 5, 60, 50), Ref("pad4_crop"),
                  "pad4_crop");
  ExpectIdentical(ops::Crop(ops::Pad(x, 2, 3, 4, 5, 7, constant), 0, 0, 88, 66),
                  Ref("pad_fill_crop"), "pad_fill_crop");
  ExpectIdentical(ops::HorizontalFlip(x), Ref("hflip"), "hflip");
  ExpectIdentical(ops::Resize(ops::Crop(x, 10, 7, 50, 40), 24, 24, bilinear, true),
                  Ref("resized_crop"), "resized_crop");
  ExpectIdentical(ops::AdjustBrightness(x, 1.3), Ref("brightness_1.3"), "brightness_1.3");
  ExpectIdentical(ops::AdjustBrightness(x, 0.45), Ref("brightness_0.45"), "brightness_0.45");
  ExpectIdentical(ops::AdjustContrast(x, 0.6), Ref("contrast_0.6"), "contrast_0.6");
  ExpectIdentical(ops::AdjustContrast(x, 1.8), Ref("contrast_1.8"), "contrast_1.8");
  ExpectIdentical(ops::AdjustSaturation(x, 1.7), Ref("saturation_1.7"), "saturation_1.7");
  ExpectIdentical(ops::AdjustSaturation(x, 0.2), Ref("saturation_0.2"), "saturation_0.2");
  ExpectIdentical(ops::AdjustHue(x, 0.2), Ref("hue_0.2"), "hue_0.2");
  ExpectIdentical(ops::AdjustHue(x, -0.35), Ref("hue_-0.35"), "hue_-0.35");
  ExpectIdentical(ops::ToFloat(x), Ref("to_tensor"), "to_tensor");
  ExpectIdentical(
      ops::Normalize(ops::ToFloat(x), {0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}),
      Ref("normalize"), "normalize");
  ExpectIdentical(ops::AdjustBrightness(ops::ToFloat(x), 1.3), Ref("brightness_float_1.3"),
                  "brightness_float_1.3");
  ExpectIdentical(ops::AdjustContrast(ops::ToFloat(x), 0.6), Ref("contrast_float_0.6"),
                  "contrast_float_0.6");
}

TEST_F(ImageTransformsTest, Pipeline_EqualsTorchvisionCompose) {
  SampleRandom rng(1);
  // Compose([Resize(40), ToTensor()]) on the image: the smaller edge (61 wide) becomes 40.
  absl::StatusOr<at::Tensor> resized =
      Pipeline("train { resize { size: 40 } }").Apply(Input(), rng);
  ASSERT_TRUE(resized.ok()) << resized.status();
  ExpectIdentical(*resized, Ref("resize_short_40").to(at::kFloat).div(255), "resize [40]");

  absl::StatusOr<at::Tensor> cropped =
      Pipeline("train { center_crop { size: [30, 20] } } train { random_horizontal_flip { p: 1 } }")
          .Apply(Input(), rng);
  ASSERT_TRUE(cropped.ok()) << cropped.status();
  ExpectIdentical(*cropped, Ref("center_crop_30x20").flip({-1}).to(at::kFloat).div(255),
                  "center_crop + flip");

  // Normalize without to_tensor converts first; with one, the same.
  for (const char* text :
       {"train { normalize { mean: [0.485, 0.456, 0.406] std: [0.229, 0.224, 0.225] } }",
        "train { to_tensor {} } train { normalize { mean: [0.485, 0.456, 0.406] "
        "std: [0.229, 0.224, 0.225] } }"}) {
    absl::StatusOr<at::Tensor> normalized = Pipeline(text).Apply(Input(), rng);
    ASSERT_TRUE(normalized.ok()) << normalized.status();
    ExpectIdentical(*normalized, Ref("normalize"), text);
  }
  // No flip at p = 0; the output is contiguous float32 CHW.
  absl::StatusOr<at::Tensor> plain =
      Pipeline("train { random_horizontal_flip { p: 0 } }").Apply(Input(), rng);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->is_contiguous());
  ExpectIdentical(*plain, Ref("to_tensor"), "flip p=0");
}

// The test image (61 wide) padded by 4 and cropped to 60x50 at a random position: the crop must
// be a window of torchvision's padded image.
TEST_F(ImageTransformsTest, RandomCrop_IsAWindowOfThePaddedImage) {
  const at::Tensor padded =
      image_ops::Pad(InputChw(), 4, 4, 4, 4, 0, ImageTransform::PADDING_MODE_CONSTANT)
          .to(at::kFloat)
          .div(255);
  ImageTransformPipeline pipeline = Pipeline("train { random_crop { size: [60, 50] padding: 4 } }");
  std::set<std::pair<int, int>> positions;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    SampleRandom rng(seed);
    absl::StatusOr<at::Tensor> out = pipeline.Apply(Input(), rng);
    ASSERT_TRUE(out.ok()) << out.status();
    bool found = false;
    for (int top = 0; top <= 91 - 60 && !found; ++top) {
      for (int left = 0; left <= 69 - 50 && !found; ++left) {
        if (at::equal(padded.slice(1, top, top + 60).slice(2, left, left + 50), *out)) {
          found = true;
          positions.insert({top, left});
        }
      }
    }
    EXPECT_TRUE(found) << "seed " << seed;
  }
  EXPECT_GT(positions.size(), 10u);  // 20 draws over 32 x 20 positions
}

// Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs.
double KolmogorovSmirnov(std::vector<double> a, std::vector<double> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  size_t i = 0, j = 0;
  double d = 0;
  while (i < a.size() && j < b.size()) {
    const double x = std::min(a[i], b[j]);
    while (i < a.size() && a[i] <= x) ++i;
    while (j < b.size() && b[j] <= x) ++j;
    d = std::max(d,
                 std::abs(static_cast<double>(i) / a.size() - static_cast<double>(j) / b.size()));
  }
  return d;
}

TEST_F(ImageTransformsTest, RandomResizedCropParams_SameDistributionAsTorchvision) {
  const std::string bytes = ReadFile(*dir_ + "/rrc_params.i32");
  const size_t n = bytes.size() / (4 * sizeof(int32_t));
  ASSERT_EQ(n, 20000u);
  const auto* theirs = reinterpret_cast<const int32_t*>(bytes.data());
  std::map<std::string, std::vector<double>> ours_by, theirs_by;
  SampleRandom rng(SampleSeed(42, 0, "rrc"));
  for (size_t k = 0; k < n; ++k) {
    CropBox box = RandomResizedCropParams(300, 250, 0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0, rng);
    ASSERT_GE(box.top, 0);
    ASSERT_GE(box.left, 0);
    ASSERT_LE(box.top + box.height, 300);
    ASSERT_LE(box.left + box.width, 250);
    const int32_t* t = theirs + 4 * k;
    for (auto [by, box_values] :
         {std::make_pair(&ours_by, std::array<double, 4>{double(box.top), double(box.left),
                                                         double(box.height), double(box.width)}),
          std::make_pair(&theirs_by, std::array<double, 4>{double(t[0]), double(t[1]), double(t[2]),
                                                           double(t[3])})}) {
      (*by)["top"].push_back(box_values[0]);
      (*by)["left"].push_back(box_values[1]);
      (*by)["height"].push_back(box_values[2]);
      (*by)["width"].push_back(box_values[3]);
      (*by)["area"].push_back(box_values[2] * box_values[3]);
      (*by)["ratio"].push_back(box_values[3] / box_values[2]);
    }
  }
  // The critical value at a 0.1% significance level for two samples of n: 1.949 * sqrt(2 / n)
  // = 0.0195. A real difference in the distributions (say a uniform instead of a log-uniform
  // ratio) gives a statistic several times that; equal ones exceed it once in a thousand runs
  // per quantity, and the draws are seeded, so the test does not flake.
  const double critical = 1.949 * std::sqrt(2.0 / n);
  for (const char* q : {"top", "left", "height", "width", "area", "ratio"}) {
    const double d = KolmogorovSmirnov(ours_by[q], theirs_by[q]);
    EXPECT_LT(d, critical) << q;
    std::vector<double> a = ours_by[q], b = theirs_by[q];
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    std::cout << q << ": KS " << d << " (critical " << critical << "); quartiles ours " << a[n / 4]
              << "/" << a[n / 2] << "/" << a[3 * n / 4] << " torchvision " << b[n / 4] << "/"
              << b[n / 2] << "/" << b[3 * n / 4] << "\n";
  }
}

// ColorJitter's draws against torchvision's get_params: each factor's and the hue shift's
// distribution (a saturation of 1.5 clamps its range at 0), and where each adjustment falls in
// the random order.
TEST_F(ImageTransformsTest, ColorJitterParams_SameDistributionAsTorchvision) {
  const std::string bytes = ReadFile(*dir_ + "/colorjitter_params.f64");
  const size_t n = bytes.size() / (8 * sizeof(double));
  ASSERT_EQ(n, 20000u);
  const auto* theirs = reinterpret_cast<const double*>(bytes.data());
  v1::ImageTransform::ColorJitter jitter;
  jitter.set_brightness(0.4f);
  jitter.set_contrast(0.6f);
  jitter.set_saturation(1.5f);
  jitter.set_hue(0.1f);
  std::map<std::string, std::vector<double>> ours_by, theirs_by;
  SampleRandom rng(SampleSeed(42, 0, "jitter"));
  const char* kOps[] = {"brightness at", "contrast at", "saturation at", "hue at"};
  for (size_t k = 0; k < n; ++k) {
    const ColorJitterParams p = DrawColorJitterParams(jitter, rng);
    ASSERT_EQ(p.order.size(), 4u);
    ASSERT_GE(p.saturation, 0.0);
    ASSERT_LE(std::abs(p.hue), 0.1 + 1e-9);
    const double* t = theirs + 8 * k;
    for (int slot = 0; slot < 4; ++slot) {
      ours_by[kOps[p.order[slot]]].push_back(slot);
      theirs_by[kOps[static_cast<int>(t[slot])]].push_back(slot);
    }
    for (auto [by, v] :
         {std::make_pair(&ours_by,
                         std::array<double, 4>{p.brightness, p.contrast, p.saturation, p.hue}),
          std::make_pair(&theirs_by, std::array<double, 4>{t[4], t[5], t[6], t[7]})}) {
      (*by)["brightness"].push_back(v[0]);
      (*by)["contrast"].push_back(v[1]);
      (*by)["saturation"].push_back(v[2]);
      (*by)["hue"].push_back(v[3]);
    }
  }
  // As for RandomResizedCrop: the two-sample critical value at 0.1%.
  const double critical = 1.949 * std::sqrt(2.0 / n);
  for (const char* q : {"brightness", "contrast", "saturation", "hue", "brightness at",
                        "contrast at", "saturation at", "hue at"}) {
    ASSERT_EQ(ours_by[q].size(), theirs_by[q].size()) << q;
    const double d = KolmogorovSmirnov(ours_by[q], theirs_by[q]);
    EXPECT_LT(d, critical) << q;
    std::cout << q << ": KS " << d << " (critical " << critical << ")\n";
  }
}

TEST_F(ImageTransformsTest, RandomResizedCropParams_FallbackIsClampedCenterCrop) {
  SampleRandom rng(3);
  // A 10x1000 strip: no draw of area 0.9-1.0 with ratio 3/4..4/3 fits, so the fallback takes
  // the full height and a width of round(10 * 4/3) = 13, centered.
  CropBox box = RandomResizedCropParams(10, 1000, 0.9, 1.0, 3.0 / 4.0, 4.0 / 3.0, rng);
  EXPECT_EQ(box.height, 10);
  EXPECT_EQ(box.width, 13);
  EXPECT_EQ(box.top, 0);
  EXPECT_EQ(box.left, (1000 - 13) / 2);
}

TEST_F(ImageTransformsTest, Seeding_SameKeyAndEpochSameOutput_OtherEpochDiffers) {
  ImageTransformPipeline pipeline = Pipeline(
      "train { random_resized_crop { size: 32 } } train { random_horizontal_flip {} } "
      "train { color_jitter { brightness: 0.4 contrast: 0.4 saturation: 0.4 hue: 0.1 } } "
      "train { normalize { mean: [0.5, 0.5, 0.5] std: [0.25, 0.25, 0.25] } }");
  auto run = [&](uint64_t seed, int64_t epoch, const std::string& key) {
    SampleRandom rng(SampleSeed(seed, epoch, key));
    absl::StatusOr<at::Tensor> out = pipeline.Apply(Input(), rng);
    EXPECT_TRUE(out.ok()) << out.status();
    return *out;
  };
  const at::Tensor first = run(7, 3, "n01440764/img_0001");
  EXPECT_EQ(first.sizes(), (std::vector<int64_t>{3, 32, 32}));
  EXPECT_TRUE(at::equal(first, run(7, 3, "n01440764/img_0001")));
  EXPECT_FALSE(at::equal(first, run(7, 4, "n01440764/img_0001")));
  EXPECT_FALSE(at::equal(first, run(8, 3, "n01440764/img_0001")));
  EXPECT_FALSE(at::equal(first, run(7, 3, "n01440764/img_0002")));
  // The seed function is part of what a resumed job relies on: it must draw what the first run
  // drew, with any build. Values computed apart (in Python) from the function's definition.
  EXPECT_EQ(SampleSeed(0, 0, ""), 0x7dc2c42b173ebf65ull);
  EXPECT_EQ(SampleSeed(7, 3, "n01440764/img_0001"), 0x8f0ae155bd57ad4bull);
  EXPECT_NE(SampleSeed(0, 0, "a"), SampleSeed(0, 1, "a"));
  EXPECT_NE(SampleSeed(1, 0, "a"), SampleSeed(0, 0, "a"));
}

TEST_F(ImageTransformsTest, DecodeAndApply_EqualsDecodeThenApply) {
  const std::string jpeg = ReadFile(*dir_ + "/input.jpg");
  ASSERT_FALSE(jpeg.empty());
  for (const char* text :
       {"train { random_resized_crop { size: 24 } } train { random_horizontal_flip {} } "
        "train { normalize { mean: [0.5] std: [0.2] } }",
        "train { center_crop { size: [40, 30] } } train { to_tensor {} }",
        "train { center_crop { size: [100, 30] } }", "train { resize { size: [20, 20] } }"}) {
    ImageTransformPipeline pipeline = Pipeline(text);
    for (uint64_t seed = 0; seed < 30; ++seed) {
      SampleRandom a(seed), b(seed);
      absl::StatusOr<DecodedImage> image = DecodeImage(jpeg);
      ASSERT_TRUE(image.ok());
      absl::StatusOr<at::Tensor> apart = pipeline.Apply(*std::move(image), a);
      absl::StatusOr<at::Tensor> fused = pipeline.DecodeAndApply(jpeg, {}, b);
      ASSERT_TRUE(apart.ok()) << apart.status();
      ASSERT_TRUE(fused.ok()) << fused.status();
      ASSERT_TRUE(at::equal(*apart, *fused)) << text << " seed " << seed;
    }
  }
  SampleRandom rng(0);
  absl::StatusOr<at::Tensor> broken = Pipeline("train { random_resized_crop { size: 24 } }")
                                          .DecodeAndApply("not an image", {}, rng);
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInvalidArgument);
}

// RandomResizedCrop + flip + ToTensor + Normalize runs as one fused pass; it must equal the
// composition of the ATen ops (each checked against torchvision above), draw for draw.
TEST_F(ImageTransformsTest, FusedTrainingPipeline_EqualsComposedOps) {
  namespace ops = image_ops;
  const at::Tensor x = InputChw();
  for (const char* text :
       {"train { random_resized_crop { size: 224 } } train { random_horizontal_flip {} } "
        "train { to_tensor {} } train { normalize { mean: [0.485, 0.456, 0.406] "
        "std: [0.229, 0.224, 0.225] } }",
        "train { random_resized_crop { size: [17, 30] scale: [0.5, 1] } } "
        "train { random_horizontal_flip { p: 0.5 } }"}) {
    ImageTransformPipeline pipeline = Pipeline(text);
    v1::DataTransforms spec;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &spec));
    const auto& rrc = spec.train(0).random_resized_crop();
    const int out_h = rrc.size(0);
    const int out_w = rrc.size().size() == 2 ? rrc.size(1) : rrc.size(0);
    const double scale_min = rrc.scale().empty() ? 0.08 : rrc.scale(0);
    const bool normalize = spec.train().size() == 4;
    int flips = 0;
    for (uint64_t seed = 0; seed < 40; ++seed) {
      SampleRandom a(seed), b(seed);
      absl::StatusOr<at::Tensor> fused = pipeline.Apply(Input(), a);
      ASSERT_TRUE(fused.ok()) << fused.status();
      CropBox box = RandomResizedCropParams(83, 61, scale_min, 1.0, 3.0 / 4.0, 4.0 / 3.0, b);
      at::Tensor expected = ops::Resize(ops::Crop(x, box.top, box.left, box.height, box.width),
                                        out_h, out_w, ImageTransform::INTERPOLATION_BILINEAR, true);
      if (b.Uniform(0, 1) < 0.5) {
        expected = ops::HorizontalFlip(expected);
        ++flips;
      }
      expected = ops::ToFloat(expected);
      if (normalize) {
        expected = ops::Normalize(expected, {0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f});
      }
      ExpectIdentical(*fused, expected, absl::StrCat(text, " seed ", seed));
    }
    EXPECT_GT(flips, 5);
    EXPECT_LT(flips, 35);
  }
}

// Lists of only flips, to_tensor and normalizes run as one pass over the pixels; it must give
// the same floats as the ATen ops, draw for draw, on 3 channels and on 1.
TEST_F(ImageTransformsTest, PointwisePipeline_EqualsComposedOps) {
  namespace ops = image_ops;
  DecodedImage gray;
  gray.height = 7;
  gray.width = 5;
  gray.channels = 1;
  for (int i = 0; i < 35; ++i) gray.pixels.push_back(static_cast<uint8_t>(i * 37 % 256));
  const at::Tensor gray_chw = at::from_blob(gray.pixels.data(), {1, 7, 5}, at::kByte).clone();
  struct Case {
    const char* text;
    bool gray;
    std::vector<std::vector<float>> means, stds;  // each normalize's
  };
  const Case cases[] = {
      {"train { random_horizontal_flip {} } train { to_tensor {} } "
       "train { normalize { mean: [0.485, 0.456, 0.406] std: [0.229, 0.224, 0.225] } }",
       false,
       {{0.485f, 0.456f, 0.406f}},
       {{0.229f, 0.224f, 0.225f}}},
      {"train { normalize { mean: [0.2860] std: [0.3530] } }", true, {{0.2860f}}, {{0.3530f}}},
      {"train { to_tensor {} } train { random_horizontal_flip { p: 0.3 } } "
       "train { normalize { mean: [0.5] std: [0.25] } } "
       "train { normalize { mean: [0.1, 0.2, 0.3] std: [2, 3, 4] } }",
       false,
       {{0.5f, 0.5f, 0.5f}, {0.1f, 0.2f, 0.3f}},
       {{0.25f, 0.25f, 0.25f}, {2, 3, 4}}},
      {"train { to_tensor {} }", true, {}, {}},
  };
  for (const Case& c : cases) {
    ImageTransformPipeline pipeline = Pipeline(c.text);
    const bool flips = std::string(c.text).find("flip") != std::string::npos;
    const double p = std::string(c.text).find("p: 0.3") != std::string::npos ? 0.3 : 0.5;
    int flipped = 0;
    for (uint64_t seed = 0; seed < 20; ++seed) {
      SampleRandom a(seed), b(seed);
      absl::StatusOr<at::Tensor> ours = pipeline.Apply(c.gray ? gray : Input(), a);
      ASSERT_TRUE(ours.ok()) << ours.status();
      at::Tensor expected = ops::ToFloat(c.gray ? gray_chw : InputChw());
      if (flips && b.Uniform(0, 1) < p) {
        expected = ops::HorizontalFlip(expected);
        ++flipped;
      }
      for (size_t k = 0; k < c.means.size(); ++k) {
        expected = ops::Normalize(expected, c.means[k], c.stds[k]);
      }
      ASSERT_TRUE(at::equal(*ours, expected.contiguous())) << c.text << " seed " << seed;
    }
    if (flips) {
      EXPECT_GT(flipped, 0) << c.text;
      EXPECT_LT(flipped, 20) << c.text;
    }
  }
}

TEST_F(ImageTransformsTest, GrayscaleImage_OneChannelOut) {
  DecodedImage gray;
  gray.height = 20;
  gray.width = 10;
  gray.channels = 1;
  gray.pixels.assign(200, 128);
  SampleRandom rng(0);
  absl::StatusOr<at::Tensor> out =
      Pipeline(
          "train { color_jitter { brightness: 0.5 saturation: 0.5 hue: 0.2 } } "
          "train { normalize { mean: [0.5] std: [0.5] } }")
          .Apply(gray, rng);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->sizes(), (std::vector<int64_t>{1, 20, 10}));
  absl::StatusOr<at::Tensor> mismatch =
      Pipeline("train { normalize { mean: [0.5, 0.5, 0.5] std: [1, 1, 1] } }").Apply(gray, rng);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mismatch.status().message(), HasSubstr("3 means for an image of 1 channels"));
}

TEST_F(ImageTransformsTest, Create_NamesPositionAndField) {
  const std::pair<const char*, const char*> cases[] = {
      {"train { resize { size: 8 } } train { normalize { mean: [0.5, 0.5] std: [0.2, 0] } }",
       "transforms.train[1].normalize: std[1] must be > 0, not 0"},
      {"train { center_crop { size: [1, 2, 3] } }",
       "transforms.train[0].center_crop.size: give [s] or [h, w], not 3 values"},
      {"train { random_resized_crop { size: 0 } }",
       "transforms.train[0].random_resized_crop.size[0] must be in [1, 65536], not 0"},
      {"train { random_resized_crop { size: 8 scale: [0.5, 0.1] } }",
       "transforms.train[0].random_resized_crop.scale must be [min, max] with 0 < min <= max, "
       "not [0.5, 0.1]"},
      {"train { random_crop { size: 8 padding: [1, 2, 3] } }",
       "transforms.train[0].random_crop.padding: give [all], [left/right, top/bottom] or [left, "
       "top, right, bottom], not 3 values"},
      {"train { random_horizontal_flip { p: 1.5 } }",
       "transforms.train[0].random_horizontal_flip.p must be in [0, 1], not 1.5"},
      {"train { color_jitter { contrast: -1 } }",
       "transforms.train[0].color_jitter.contrast must be >= 0, not -1"},
      {"train { color_jitter { hue: 0.7 } }",
       "transforms.train[0].color_jitter.hue must be in [0, 0.5], not 0.7"},
      {"train { resize { size: [8, 9] max_size: 20 } }",
       "transforms.train[0].resize.max_size: only with size [s], not [h, w]"},
      {"train { normalize { mean: 0 std: 1 } } train { to_tensor {} }",
       "transforms.train[0].normalize: comes before to_tensor (at [1])"},
      {"train { to_tensor {} } train { }", "transforms.train[1]: no transform set"},
  };
  for (const auto& [text, message] : cases) {
    absl::Status status = CreateError(text);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(status.message(), HasSubstr(message)) << text;
  }
}

TEST_F(ImageTransformsTest, RandomCropLargerThanImage_InvalidArgumentNotCrash) {
  SampleRandom rng(0);
  absl::StatusOr<at::Tensor> out =
      Pipeline("train { random_crop { size: [200, 10] } }").Apply(Input(), rng);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("set pad_if_needed"));
  absl::StatusOr<at::Tensor> padded =
      Pipeline("train { random_crop { size: [200, 10] pad_if_needed: true fill: 255 } }")
          .Apply(Input(), rng);
  ASSERT_TRUE(padded.ok()) << padded.status();
  EXPECT_EQ(padded->sizes(), (std::vector<int64_t>{3, 200, 10}));
}

}  // namespace image_transforms_test
}  // namespace dtrain
