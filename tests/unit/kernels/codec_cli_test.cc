// Tests `polykv-cli codec roundtrip` (cli/codec_cmd.cc, compiled in) against the library.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "polykv/kernels/codec.h"
#include "polykv/kernels/codec_math.h"
#include "test_util.h"

namespace polykv::kernels {
namespace {

struct CliResult {
  int exit_code = 0;
  std::string out, err;
  std::map<std::string, std::string> fields;  // "key: value" lines
};

CliResult RunCli(std::vector<std::string> args) {
  cli::ExitCode() = 0;
  CLI::App app{"polykv-cli"};
  app.require_subcommand(1);
  cli::RegisterCodecCommands(app);
  args.insert(args.begin(), "polykv-cli");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  CliResult r;
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
    r.exit_code = cli::ExitCode();
  } catch (const CLI::ParseError& e) {
    r.exit_code = e.get_exit_code() == 0 ? 0 : 2;
  }
  r.out = ::testing::internal::GetCapturedStdout();
  r.err = ::testing::internal::GetCapturedStderr();
  std::istringstream is(r.out);
  for (std::string line; std::getline(is, line);) {
    const size_t c = line.find(": ");
    if (c != std::string::npos) r.fields[line.substr(0, c)] = line.substr(c + 2);
  }
  return r;
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "polykv_codec_cli_" + name;
}

template <typename T>
void WriteFile(const std::string& path, const std::string& header, const std::vector<T>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(v.data()),
          static_cast<std::streamsize>(v.size() * sizeof(T)));
}

// A .npy v1.0 header for `descr` and shape (h, t, d), padded to a multiple of 64 bytes.
std::string NpyHeader(const std::string& descr, int h, int t, int d) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" +
                     std::to_string(h) + ", " + std::to_string(t) + ", " + std::to_string(d) +
                     "), }";
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string hdr = "\x93NUMPY";
  hdr += '\x01';
  hdr += '\x00';
  hdr += static_cast<char>(dict.size() & 0xFF);
  hdr += static_cast<char>(dict.size() >> 8);
  return hdr + dict;
}

double Num(const CliResult& r, const std::string& key) {
  auto it = r.fields.find(key);
  if (it == r.fields.end()) {
    ADD_FAILURE() << "missing '" << key << "' in output:\n" << r.out;
    return NAN;
  }
  return std::stod(it->second);
}

TEST(CodecCli, RawF32NumbersMatchTheLibrary) {
  const LayerShape s{2, 16, 64};
  const auto x = testing::Gaussian(s.elements(), 77);
  const std::string path = TempPath("raw.f32");
  WriteFile(path, "", x);
  const CliResult r = RunCli({"codec", "roundtrip", "--shape", "2,16,64", "--dtype", "f32",
                              "--key-scale", "channel", "--v-bits", "3", path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Num(r, "original_bytes"), 2 * 16 * 64 * 4);
  EXPECT_EQ(Num(r, "k_bytes"), 2048 + 4 * 128);
  EXPECT_EQ(Num(r, "v_bytes"), 32 * 24 + 32 * 4);
  EXPECT_NEAR(Num(r, "ratio"), 2.0 * 8192 / (2560 + 896), 1e-4);
  // Library reference.
  CodecConfig cfg;
  cfg.key_scale = KeyScaleMode::kPerChannel;
  std::vector<int8_t> q(s.elements());
  std::vector<float> sc(KeyScaleCount(s, cfg.key_scale)), kh(s.elements());
  ASSERT_TRUE(QuantizeKeys(x.data(), DType::kF32, s, cfg.key_scale, q.data(), sc.data()).ok());
  ASSERT_TRUE(DequantizeKeys(q.data(), sc.data(), s, cfg.key_scale, kh.data(), DType::kF32).ok());
  std::vector<uint8_t> packed(32 * 24);
  std::vector<float> norms(32), vh(s.elements());
  ASSERT_TRUE(EncodeValues(x.data(), DType::kF32, s, cfg, packed.data(), norms.data()).ok());
  ASSERT_TRUE(DecodeValues(packed.data(), norms.data(), s, cfg, vh.data(), DType::kF32).ok());
  double kmax = 0, vmax = 0;
  for (int64_t i = 0; i < s.elements(); ++i) {
    kmax = std::max(kmax, std::fabs(double{kh[i]} - x[i]));
    vmax = std::max(vmax, std::fabs(double{vh[i]} - x[i]));
  }
  EXPECT_NEAR(Num(r, "k_max_abs_error"), kmax, 1e-5 * kmax);
  EXPECT_NEAR(Num(r, "k_rel_mse"), testing::RelMse(kh, x), 1e-5 * testing::RelMse(kh, x));
  EXPECT_NEAR(Num(r, "v_max_abs_error"), vmax, 1e-5 * vmax);
  EXPECT_NEAR(Num(r, "v_rel_mse"), testing::RelMse(vh, x), 1e-5 * testing::RelMse(vh, x));
  EXPECT_EQ(r.fields.at("v_codes_used"), "8/8");
  std::remove(path.c_str());
}

TEST(CodecCli, NpyBf16WithOutFileEqualsLibraryDecode) {
  const LayerShape s{1, 8, 48};
  const auto xh = testing::ToHalf(testing::Gaussian(s.elements(), 78), DType::kBF16);
  const std::string path = TempPath("in.npy"), out = TempPath("out.bf16");
  WriteFile(path, NpyHeader("<u2", 1, 8, 48), xh);
  const CliResult r =
      RunCli({"codec", "roundtrip", "--shape", "1,8,48", "--dtype", "bf16", "--v-bits", "4",
              "--seed", "99", "--norm-correction", "--out", out, path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Num(r, "original_bytes"), 8 * 48 * 2);
  EXPECT_EQ(Num(r, "v_bytes"), 8 * 24 + 8 * 4);
  CodecConfig cfg;
  cfg.value_bits = 4;
  cfg.rotation_seed = 99;
  cfg.norm_correction = true;
  std::vector<uint8_t> packed(8 * 24);
  std::vector<float> norms(8);
  std::vector<uint16_t> dec(s.elements());
  ASSERT_TRUE(EncodeValues(xh.data(), DType::kBF16, s, cfg, packed.data(), norms.data()).ok());
  ASSERT_TRUE(DecodeValues(packed.data(), norms.data(), s, cfg, dec.data(), DType::kBF16).ok());
  std::ifstream f(out, std::ios::binary);
  std::vector<uint16_t> got(s.elements());
  f.read(reinterpret_cast<char*>(got.data()), static_cast<std::streamsize>(got.size() * 2));
  ASSERT_EQ(f.gcount(), static_cast<std::streamsize>(got.size() * 2));
  EXPECT_EQ(got, dec);
  std::remove(path.c_str());
  std::remove(out.c_str());
}

TEST(CodecCli, BadInputsPrintErrorsAndSetExitCode) {
  const std::string path = TempPath("small.f32");
  WriteFile(path, "", std::vector<float>(100, 1.0f));
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  } cases[] = {
      {{"--shape", "1,2,64", "--dtype", "f32", path}, "file too small"},
      {{"--shape", "1,1,8", "--dtype", "f32", path}, "file too large"},
      {{"--shape", "1,25,4", "--dtype", "f64", path}, "--dtype must be"},
      {{"--shape", "1,25", "--dtype", "f32", path}, "--shape must be"},
      {{"--shape", "1,25,4", "--dtype", "f32", "--v-bits", "5", path}, "value_bits"},
      {{"--shape", "1,25,4", "--dtype", "f32", "--k-bits", "4", path}, "key_bits"},
      {{"--shape", "1,25,4", "--dtype", "f32", "--key-scale", "row", path}, "--key-scale"},
      {{"--shape", "1,25,4", "--dtype", "f32", "/nonexistent/polykv.f32"}, "cannot read"},
  };
  for (auto& c : cases) {
    std::vector<std::string> args = {"codec", "roundtrip"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const CliResult r = RunCli(args);
    EXPECT_EQ(r.exit_code, 1) << c.expect;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
  }
  // .npy header checks: dtype and shape must match.
  const std::string npy = TempPath("bad.npy");
  WriteFile(npy, NpyHeader("<f4", 2, 3, 4), std::vector<float>(24, 1.0f));
  CliResult r = RunCli({"codec", "roundtrip", "--shape", "2,3,4", "--dtype", "f16", npy});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("dtype '<f4' does not match"), std::string::npos) << r.err;
  r = RunCli({"codec", "roundtrip", "--shape", "2,4,3", "--dtype", "f32", npy});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("does not match --shape"), std::string::npos) << r.err;
  r = RunCli({"codec", "roundtrip", "--shape", "2,3,4", "--dtype", "f32", npy});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // NaN input is reported with its index.
  std::vector<float> nan(24, 1.0f);
  nan[7] = NAN;
  WriteFile(path, "", nan);
  r = RunCli({"codec", "roundtrip", "--shape", "2,3,4", "--dtype", "f32", path});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("NaN at element 7"), std::string::npos) << r.err;
  std::remove(path.c_str());
  std::remove(npy.c_str());
  cli::ExitCode() = 0;
}

}  // namespace
}  // namespace polykv::kernels
