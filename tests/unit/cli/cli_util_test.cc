// cli/util: ParseTokenIds, ReadFile / ReadFilePrefix / ReadFileOrStdin / WriteFile, FailWith.
#include <gtest/gtest.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "util/errors.h"
#include "util/files.h"
#include "util/token_ids.h"

namespace polykv::cli {
namespace {

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "polykv_cli_util_" + std::to_string(getpid()) + "_" + name;
}

TEST(CliTokenIds, ParsesCommasAndBlanks) {
  auto ids = ParseTokenIds("1,2, 3\t4\n5 ,,6", "--token-ids");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  auto edge = ParseTokenIds("0 2147483647 +7", "--prompt-ids");
  ASSERT_TRUE(edge.ok()) << edge.status();
  EXPECT_EQ(*edge, (std::vector<int32_t>{0, INT32_MAX, 7}));
}

TEST(CliTokenIds, RejectsNegativeIdsWithAClearError) {
  for (const char* text : {"-1", "1,-5,3", "7 -2147483648"}) {
    auto ids = ParseTokenIds(text, "--score-ids");
    ASSERT_FALSE(ids.ok()) << text;
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(ids.status().message().find("--score-ids: \"-"), std::string::npos) << ids.status();
    EXPECT_NE(ids.status().message().find("\" is negative: token ids are 0..2147483647"),
              std::string::npos)
        << ids.status();
  }
  EXPECT_EQ(ParseTokenIds("1,-5,3", "--token-ids").status().message(),
            "--token-ids: \"-5\" is negative: token ids are 0..2147483647");
}

TEST(CliTokenIds, RejectsTooLargeNonNumbersAndNothing) {
  EXPECT_EQ(ParseTokenIds("2147483648", "--token-ids").status().message(),
            "--token-ids: \"2147483648\" is too large: token ids are 0..2147483647");
  EXPECT_EQ(ParseTokenIds("99999999999999999999999", "--token-ids").status().message(),
            "--token-ids: \"99999999999999999999999\" is too large: token ids are 0..2147483647");
  for (const char* bad : {"x", "1,x,3", "1.5", "0x10", "3a", "-", "1;2"}) {
    auto ids = ParseTokenIds(bad, "--token-ids");
    ASSERT_FALSE(ids.ok()) << bad;
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(ids.status().message().find("is not a token id (expected 1,2,3)"), std::string::npos)
        << ids.status();
  }
  EXPECT_EQ(ParseTokenIds("1,x,3", "--token-ids").status().message(),
            "--token-ids: \"x\" is not a token id (expected 1,2,3)");
  EXPECT_EQ(ParseTokenIds(" , \n", "--prompt-ids").status().message(),
            "--prompt-ids: no token ids given");
}

TEST(CliFiles, ReadsAndWritesEveryByte) {
  const std::string path = TempPath("bytes");
  const std::string bytes("a\0b\r\n\xff", 6);
  ASSERT_TRUE(WriteFile(path, bytes).ok());
  auto back = ReadFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, bytes);
  auto head = ReadFilePrefix(path, 3);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(*head, bytes.substr(0, 3));
  auto all = ReadFilePrefix(path, 100);  // longer than the file: all of it
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, bytes);
  ASSERT_TRUE(WriteFile(path, "").ok());  // truncates
  EXPECT_EQ(ReadFile(path).value_or("x"), "");
  std::remove(path.c_str());
}

TEST(CliFiles, ErrorsNameTheFile) {
  const std::string missing = TempPath("missing/none.txt");
  auto r = ReadFile(missing, "document file");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "cannot read document file " + missing);
  EXPECT_EQ(ReadFile(missing).status().message(), "cannot read " + missing);
  EXPECT_EQ(ReadFilePrefix(missing, 10, "questions file").status().message(),
            "cannot read questions file " + missing);
  const Status w = WriteFile(missing, "x");
  EXPECT_EQ(w.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(w.message(), "cannot write " + missing);
}

TEST(CliFiles, DashReadsStandardInputOnlyWhenAsked) {
  std::istringstream fake("from stdin\n");
  std::streambuf* saved = std::cin.rdbuf(fake.rdbuf());
  auto in = ReadFileOrStdin("-", "document file");
  std::cin.rdbuf(saved);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(*in, "from stdin\n");
  // ReadFile itself takes "-" as a file name.
  EXPECT_EQ(ReadFile("-", "document file").status().message(), "cannot read document file -");
}

// FailWith(s), from exit code 0, prints `line` on stderr and sets exit code 1.
void ExpectFailWith(const absl::Status& s, const std::string& line) {
  ExitCode() = 0;
  ::testing::internal::CaptureStderr();
  FailWith(s);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), line);
  EXPECT_EQ(ExitCode(), 1);
}

TEST(CliErrors, FailWithPrintsOneLineAndSetsTheExitCode) {
  ExpectFailWith(absl::NotFoundError("cannot read document file /x"),
                 "error: NOT_FOUND: cannot read document file /x\n");
  ExpectFailWith(absl::InvalidArgumentError("give --prompt TEXT or --prompt-ids IDS"),
                 "error: INVALID_ARGUMENT: give --prompt TEXT or --prompt-ids IDS\n");
  // An OK status is a caller's bug: still a failure, never a silent exit code 0.
  ExpectFailWith(absl::OkStatus(), "error: UNKNOWN: failed without a status\n");
  ExitCode() = 0;
}

}  // namespace
}  // namespace polykv::cli
