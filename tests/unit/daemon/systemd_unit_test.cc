// The installed systemd unit: `systemd-analyze verify` accepts the configured
// polykvd.service (skipped visibly when systemd-analyze is not available).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "support/files.h"

namespace {

using polykv::support::ReadFile;

const std::string kUnit = std::string(POLYKV_BINARY_DIR) + "/systemd/polykvd.service";

TEST(SystemdUnitTest, HasRequiredDirectives) {
  std::string unit = ReadFile(kUnit);
  ASSERT_FALSE(unit.empty()) << kUnit;
  for (const char* line :
       {"Type=notify", "RuntimeDirectory=polykv", "RuntimeDirectoryMode=0750", "Restart=on-failure",
        "WatchdogSec=30", "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=read-only",
        "PrivateTmp=yes", "ProtectKernelTunables=yes",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6", "DeviceAllow=/dev/nvidiactl rw",
        "DeviceAllow=/dev/nvidia-uvm rw", "User=polykv", "Group=polykv",
        "--config /etc/polykv/polykvd.conf", "StateDirectory=polykv",
        "--state-dir ${STATE_DIRECTORY}"}) {
    EXPECT_NE(unit.find(line), std::string::npos) << "missing: " << line;
  }
  EXPECT_EQ(unit.find("\nPrivateDevices="), std::string::npos) << "would hide /dev/nvidia*";
  EXPECT_EQ(unit.find("@CMAKE_INSTALL_PREFIX@"), std::string::npos) << "unconfigured";
}

TEST(SystemdUnitTest, SystemdAnalyzeVerify) {
  if (access("/usr/bin/systemd-analyze", X_OK) != 0 && access("/bin/systemd-analyze", X_OK) != 0) {
    GTEST_SKIP() << "systemd-analyze is not installed; unit not verified";
  }
  // Verify a copy whose ExecStart points at the built binary (the install prefix may not
  // exist here); everything else is the configured unit.
  std::string unit = ReadFile(kUnit);
  const std::string built = std::string(POLYKV_BINARY_DIR) + "/daemon/polykvd";
  size_t pos = unit.find("ExecStart=");
  ASSERT_NE(pos, std::string::npos);
  size_t end = unit.find(' ', pos);
  unit.replace(pos, end - pos, "ExecStart=" + built);
  polykv::support::TempDir dir("polykv-unit-");
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.File("polykvd.service");
  ASSERT_TRUE(polykv::support::WriteFile(path, unit).ok());
  const std::string out = dir.File("verify.out");
  std::string cmd = "systemd-analyze verify --man=no " + path + " > " + out + " 2>&1";
  int rc = std::system(cmd.c_str());
  std::string text = ReadFile(out);
  // On machines without a running systemd, verify may still warn about the environment;
  // any message naming our unit is a real problem.
  EXPECT_EQ(text.find("polykvd.service:"), std::string::npos) << text;
  EXPECT_EQ(rc, 0) << text;
}

}  // namespace
