// `polykv-cli ping` / `pools create|list|show|evict` round trip against a real polykvd, using
// --json and parsing stdout; errors print "error: <STATUS_NAME>: message" with exit code 1.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon_process.h"
#include "support/files.h"

namespace polykv::client {
namespace {

using nlohmann::json;
using testing::CliBinary;
using testing::CommandResult;
using testing::DaemonProcess;
using testing::RunCommand;

class CliPoolsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    struct stat st;
    if (stat(testing::DaemonBinary().c_str(), &st) != 0 || stat(CliBinary().c_str(), &st) != 0) {
      GTEST_SKIP() << "polykvd or polykv-cli not built under " << POLYKV_BINARY_DIR;
    }
    daemon_ = std::make_unique<DaemonProcess>(30);
    ASSERT_TRUE(daemon_->ready()) << "polykvd did not start:\n" << daemon_->log();
  }

  CommandResult Cli(std::vector<std::string> args) {
    args.insert(args.begin(), CliBinary());
    args.push_back("--endpoint");
    args.push_back(daemon_->endpoint());
    return RunCommand(args);
  }

  /// Runs a command expected to succeed and parses its --json stdout.
  json CliJson(std::vector<std::string> args) {
    args.push_back("--json");
    CommandResult r = Cli(args);
    EXPECT_EQ(r.status, 0) << r.err << r.out;
    json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(j.is_discarded()) << "not JSON: " << r.out;
    return j;
  }

  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(CliPoolsTest, CreateListShowEvictRoundTrip) {
  json ping = CliJson({"ping"});
  EXPECT_GT(ping.value("pid", 0), 0);

  json created = CliJson({"pools", "create", "--model", testing::Stories260K(), "--token-ids",
                          "1,461,461,401,401,401,461,378,455,473,456", "--codec", "k8v3",
                          "--key-scale", "head"});
  const std::string id = created.value("id", "");
  ASSERT_EQ(id.size(), 64u) << created.dump();
  daemon_->Track(id);
  EXPECT_EQ(created["created"], true);
  EXPECT_EQ(created["codec"], "k8v3");
  EXPECT_EQ(created["tokens"], 11);

  json list = CliJson({"pools", "list"});
  ASSERT_EQ(list["pools"].size(), 1u) << list.dump();
  EXPECT_EQ(list["pools"][0]["id"], id);

  json show = CliJson({"pools", "show", id});
  EXPECT_EQ(show["id"], id);
  EXPECT_EQ(show["kv_heads"], 4);
  EXPECT_EQ(show["head_dim"], 8);
  EXPECT_EQ(show["tokens"], 11);
  EXPECT_EQ(show["backend"], "host");
  EXPECT_EQ(show["architecture"], "llama");
  EXPECT_EQ(show["tokenizer_family"], "none");  // stories260K ships no tokenizer
  const json& b = show["bytes"];
  EXPECT_EQ(b["key_codes"].get<uint64_t>() + b["key_scales"].get<uint64_t>() +
                b["value_codes"].get<uint64_t>() + b["value_norms"].get<uint64_t>() +
                b["overhead"].get<uint64_t>(),
            b["total"].get<uint64_t>());
  // int8 keys: one byte per element; 4 kv heads x 11 tokens x 8 dims per layer.
  EXPECT_EQ(b["key_codes"].get<uint64_t>(), show["layers"].get<uint64_t>() * 4 * 11 * 8);
  EXPECT_NEAR(show["effective_ratio"].get<double>(),
              show["bf16_bytes"].get<double>() / b["total"].get<double>(), 1e-9);

  // A unique prefix resolves to the pool (human output).
  CommandResult human = Cli({"pools", "show", id.substr(0, 12)});
  EXPECT_EQ(human.status, 0) << human.err;
  EXPECT_NE(human.out.find("pool " + id), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("architecture       llama\n"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("tokenizer family   none\n"), std::string::npos) << human.out;

  json evicted = CliJson({"pools", "evict", id});
  EXPECT_EQ(evicted["evicted"], true);
  json empty = CliJson({"pools", "list"});
  EXPECT_EQ(empty["pools"].size(), 0u);

  CommandResult again = Cli({"pools", "show", id});
  EXPECT_EQ(again.status, 1);
  EXPECT_EQ(again.err.rfind("error: NOT_FOUND: unknown pool " + id, 0), 0u) << again.err;
}

// The reconstruction error recorded at build: shown by `pools show`, re-measured by
// `pools verify` against a fresh prefill, and a flipped byte in a pool file is DATA_LOSS.
TEST_F(CliPoolsTest, FidelityIsRecordedShownAndVerified) {
  const std::string ids =
      "1,461,461,401,401,401,461,378,455,473,456,300,301,302,303,304,305,306,307,308,309,310";
  json created = CliJson({"pools", "create", "--model", testing::Stories260K(), "--token-ids", ids,
                          "--codec", "k8v3"});
  const std::string id = created.value("id", "");
  ASSERT_EQ(id.size(), 64u) << created.dump();
  daemon_->Track(id);
  json show = CliJson({"pools", "show", id});
  const json& f = show["fidelity"];
  EXPECT_EQ(f["layers"], show["layers"]) << show.dump();
  const double km = f["key_rel_mse_mean"].get<double>(), vm = f["value_rel_mse_mean"].get<double>();
  EXPECT_GT(km, 0.0);
  EXPECT_LT(km, 0.05) << "int8 keys lose little";
  EXPECT_GT(vm, km) << "3-bit values lose more than int8 keys";
  EXPECT_LT(vm, 0.3);
  EXPECT_GE(f["key_rel_mse_max"].get<double>(), km);
  EXPECT_GE(f["value_rel_mse_max"].get<double>(), vm);
  CommandResult human = Cli({"pools", "show", id});
  EXPECT_NE(human.out.find("rel. MSE at build  keys "), std::string::npos) << human.out;

  // Re-measured with the model: the same errors.
  json verified = CliJson({"pools", "verify", id, "--model", testing::Stories260K()});
  EXPECT_EQ(verified["ok"], true) << verified.dump();
  EXPECT_EQ(verified["fidelity_checked"], true);
  ASSERT_EQ(verified["layers"].size(), show["layers"].get<size_t>());
  for (const json& row : verified["layers"]) {
    EXPECT_NEAR(row["measured_value_rel_mse"].get<double>(), row["value_rel_mse"].get<double>(),
                0.02 * row["value_rel_mse"].get<double>() + 1e-7);
  }

  // A pool file copy: verified as it is, refused with one byte flipped in the payload.
  support::TempDir dir("polykv-verify-");  // removed with the copy inside, pass or fail
  ASSERT_TRUE(dir.ok());
  const std::string file = dir.File("pool.pkv");
  CommandResult exported = Cli({"pools", "export", id, file});
  ASSERT_EQ(exported.status, 0) << exported.err;
  json file_ok = CliJson({"pools", "verify", "--file", file, "--model", testing::Stories260K()});
  EXPECT_EQ(file_ok["ok"], true) << file_ok.dump();
  {
    std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(0, std::ios::end);
    const std::streamoff size = io.tellg();
    io.seekg(size - 100);
    char c = 0;
    io.read(&c, 1);
    c = static_cast<char>(c ^ 0x01);
    io.seekp(size - 100);
    io.write(&c, 1);
  }
  CommandResult flipped = Cli({"pools", "verify", "--file", file});
  EXPECT_EQ(flipped.status, 1) << flipped.out;
  EXPECT_EQ(flipped.err.rfind("error: DATA_LOSS: ", 0), 0u) << flipped.err;
}

TEST_F(CliPoolsTest, BadInputGivesClearErrors) {
  CommandResult bad_ids =
      Cli({"pools", "create", "--model", testing::Stories260K(), "--token-ids", "1,x,3"});
  EXPECT_EQ(bad_ids.status, 1);
  EXPECT_EQ(bad_ids.err,
            "error: INVALID_ARGUMENT: --token-ids: \"x\" is not a token id "
            "(expected 1,2,3)\n");
  CommandResult no_doc = Cli(
      {"pools", "create", "--model", testing::Stories260K(), "--document", "/nonexistent/doc.txt"});
  EXPECT_EQ(no_doc.status, 1);
  EXPECT_EQ(no_doc.err, "error: NOT_FOUND: cannot read document file /nonexistent/doc.txt\n");
  CommandResult unknown = Cli({"pools", "evict", std::string(64, 'e'), "--force"});
  EXPECT_EQ(unknown.status, 1);
  EXPECT_EQ(unknown.err.rfind("error: NOT_FOUND: unknown pool " + std::string(64, 'e'), 0), 0u)
      << unknown.err;
}

TEST(CliPoolsNoDaemonTest, DeadEndpointIsUnavailable) {
  struct stat st;
  if (stat(CliBinary().c_str(), &st) != 0) GTEST_SKIP() << "polykv-cli not built";
  CommandResult r = RunCommand({CliBinary(), "ping", "--endpoint",
                                "ipc:///tmp/polykv-client-cli-none.sock", "--timeout-ms", "50"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err,
            "error: UNAVAILABLE: no polykvd socket at /tmp/polykv-client-cli-none.sock (is the "
            "daemon running?)\n")
      << r.err;
  EXPECT_EQ(r.out, "");
}

}  // namespace
}  // namespace polykv::client
