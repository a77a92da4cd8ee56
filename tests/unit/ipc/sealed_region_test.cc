// Sealed memfd regions and descriptor passing: sealing makes the region immutable for every
// descriptor and mapping, MapSealed refuses unsealed or short descriptors, SCM_RIGHTS
// carries a descriptor, and socket probing tells missing, stale and live sockets apart.
#include "polykv/ipc/sealed_region.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>

namespace polykv::ipc {
namespace {

TEST(SealedRegionTest, SealMakesTheRegionImmutable) {
  auto r = SealedRegion::Create("polykv-sealed-test", 3 * 4096 + 5);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_NE(r->writable_data(), nullptr);
  std::memset(r->writable_data(), 0xab, r->size());
  EXPECT_EQ(GetSeals(r->fd()) & kPoolSealsRequired, 0);
  ASSERT_TRUE(r->Seal().ok());
  ASSERT_TRUE(r->Seal().ok()) << "idempotent";
  EXPECT_EQ(r->writable_data(), nullptr);
  ASSERT_NE(r->data(), nullptr);
  EXPECT_EQ(static_cast<const uint8_t*>(r->data())[r->size() - 1], 0xab);
  EXPECT_EQ(GetSeals(r->fd()) & (kPoolSealsRequired | F_SEAL_SEAL),
            kPoolSealsRequired | F_SEAL_SEAL);
  char byte = 0;
  EXPECT_EQ(pwrite(r->fd(), &byte, 1, 0), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(r->fd(), 1), 0);
  EXPECT_NE(fallocate(r->fd(), 0, 0, 1 << 20), 0);
  EXPECT_EQ(mmap(nullptr, 4096, PROT_WRITE, MAP_SHARED, r->fd(), 0), MAP_FAILED);
  EXPECT_NE(fcntl(r->fd(), F_ADD_SEALS, F_SEAL_FUTURE_WRITE), 0) << "F_SEAL_SEAL holds";
  // A MAP_PRIVATE copy-on-write mapping may be written, but never reaches the memfd.
  void* cow = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, r->fd(), 0);
  ASSERT_NE(cow, MAP_FAILED);
  static_cast<uint8_t*>(cow)[0] = 0x11;
  EXPECT_EQ(static_cast<const uint8_t*>(r->data())[0], 0xab);
  munmap(cow, 4096);
}

TEST(SealedRegionTest, MapSealedChecksSealsAndSize) {
  auto r = SealedRegion::Create("polykv-sealed-test", 8192);
  ASSERT_TRUE(r.ok());
  auto unsealed = SealedRegion::MapSealed(UniqueFd(dup(r->fd())), 0);
  EXPECT_EQ(unsealed.status().code(), absl::StatusCode::kPermissionDenied);
  ASSERT_TRUE(r->Seal().ok());
  auto too_small = SealedRegion::MapSealed(UniqueFd(dup(r->fd())), 8193);
  EXPECT_EQ(too_small.status().code(), absl::StatusCode::kDataLoss);
  auto ok = SealedRegion::MapSealed(UniqueFd(dup(r->fd())), 8192);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->size(), 8192u);
  EXPECT_EQ(ok->writable_data(), nullptr);
  EXPECT_NE(mprotect(const_cast<void*>(ok->data()), 4096, PROT_READ | PROT_WRITE), 0);
  // Not a memfd at all.
  UniqueFd devnull(open("/dev/null", O_RDONLY));
  EXPECT_EQ(SealedRegion::MapSealed(std::move(devnull), 0).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(SealedRegion::Create("x", 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SealedRegionTest, DescriptorTravelsOverSeqpacketWithScmRights) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  auto r = SealedRegion::Create("polykv-sealed-test", 4096);
  ASSERT_TRUE(r.ok());
  static_cast<char*>(r->writable_data())[7] = 'Q';
  ASSERT_TRUE(r->Seal().ok());
  ASSERT_TRUE(SendWithFd(a.get(), "OK 4096", r->fd()).ok());
  auto got = RecvWithFd(b.get(), 64, 1000);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->first, "OK 4096");
  ASSERT_TRUE(got->second.valid());
  auto mapped = SealedRegion::MapSealed(std::move(got->second), 4096);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(static_cast<const char*>(mapped->data())[7], 'Q');
  // Without a descriptor; oversized; timeout; peer gone.
  ASSERT_TRUE(SendWithFd(a.get(), "ERR NOT_FOUND x", -1).ok());
  got = RecvWithFd(b.get(), 64, 1000);
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->second.valid());
  ASSERT_TRUE(SendWithFd(a.get(), std::string(100, 'x'), -1).ok());
  EXPECT_EQ(RecvWithFd(b.get(), 64, 1000).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RecvWithFd(b.get(), 64, 10).status().code(), absl::StatusCode::kDeadlineExceeded);
  a.Reset();
  EXPECT_EQ(RecvWithFd(b.get(), 64, 1000).status().code(), absl::StatusCode::kUnavailable);
}

TEST(SealedRegionTest, ProbeTellsMissingStaleAndLiveSocketsApart) {
  const std::string path = "/tmp/polykv-probe-test-" + std::to_string(getpid()) + ".sock";
  unlink(path.c_str());
  Status missing = ProbeUnixSocket(path, SOCK_STREAM);
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(std::string(missing.message()),
            "no polykvd socket at " + path + " (is the daemon running?)");
  UniqueFd s(socket(AF_UNIX, SOCK_STREAM, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  Status stale = ProbeUnixSocket(path, SOCK_STREAM);
  EXPECT_EQ(stale.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(stale.message()).find("nothing is listening"), std::string::npos);
  ASSERT_EQ(listen(s.get(), 4), 0);
  EXPECT_TRUE(ProbeUnixSocket(path, SOCK_STREAM).ok());
  unlink(path.c_str());
  auto fd = RequestPoolFd(path, "lease", 500);
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace polykv::ipc
