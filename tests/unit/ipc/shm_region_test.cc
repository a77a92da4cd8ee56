// POSIX shm regions: create, read-only open (checked through /proc/self/maps), remove,
// create over an existing name.
#include "polykv/ipc/shm_region.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace polykv::ipc {
namespace {

std::string UniqueName(const char* tag) {
  return "/polykv-test-" + std::string(tag) + "-" + std::to_string(getpid());
}

bool ShmExists(const std::string& name) { return access(("/dev/shm" + name).c_str(), F_OK) == 0; }

// Permissions ("r--s", "rw-s") of the mapping containing `addr`, from /proc/self/maps.
std::string MappingPerms(const void* addr) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto a = reinterpret_cast<uintptr_t>(addr);
  while (std::getline(maps, line)) {
    uintptr_t lo = 0, hi = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %7s", &lo, &hi, perms) == 3 && a >= lo && a < hi) {
      return perms;
    }
  }
  return "";
}

class ShmRegionTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const auto& n : names_) (void)ShmRegion::Remove(n);
  }
  std::string Name(const char* tag) {
    names_.push_back(UniqueName(tag));
    return names_.back();
  }
  std::vector<std::string> names_;
};

TEST_F(ShmRegionTest, CreateWriteOpenReadOnly) {
  const std::string name = Name("rw");
  auto owner = ShmRegion::Create(name, 3 * 4096 + 5);
  ASSERT_TRUE(owner.ok()) << owner.status();
  EXPECT_TRUE(owner->owner());
  EXPECT_EQ(owner->size(), 3u * 4096 + 5);
  EXPECT_EQ(owner->name(), name);
  EXPECT_TRUE(ShmExists(name));
  std::memset(owner->data(), 0xAB, owner->size());
  EXPECT_EQ(MappingPerms(owner->data()).substr(0, 3), "rw-");

  auto reader = ShmRegion::OpenReadOnly(name);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_FALSE(reader->owner());
  EXPECT_EQ(reader->size(), 3u * 4096 + 5);
  const auto* bytes = static_cast<const uint8_t*>(reader->data());
  EXPECT_EQ(bytes[0], 0xAB);
  EXPECT_EQ(bytes[reader->size() - 1], 0xAB);
  // The reader's mapping is PROT_READ: writing through it would fault.
  std::string perms = MappingPerms(reader->data());
  ASSERT_EQ(perms.size(), 4u) << "mapping not found in /proc/self/maps";
  EXPECT_EQ(perms.substr(0, 2), "r-");
  EXPECT_EQ(perms[3], 's');
  // Writes by the owner are visible to the reader (same pages).
  static_cast<uint8_t*>(owner->data())[7] = 0x11;
  EXPECT_EQ(bytes[7], 0x11);

  // A non-owner going away does not unlink.
  { ShmRegion moved = std::move(*reader); }
  EXPECT_TRUE(ShmExists(name));
}

TEST_F(ShmRegionTest, OwnerDestructionUnlinksButMappingsStayValid) {
  const std::string name = Name("unlink");
  auto owner = ShmRegion::Create(name, 4096);
  ASSERT_TRUE(owner.ok());
  static_cast<uint8_t*>(owner->data())[100] = 42;
  auto reader = ShmRegion::OpenReadOnly(name);
  ASSERT_TRUE(reader.ok());
  owner = absl::UnknownError("drop");  // destroys the owner region
  EXPECT_FALSE(ShmExists(name));
  EXPECT_EQ(static_cast<const uint8_t*>(reader->data())[100], 42);  // POSIX: pages live on
  EXPECT_EQ(ShmRegion::OpenReadOnly(name).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ShmRegionTest, CreateOverExistingNameFails) {
  const std::string name = Name("dup");
  auto a = ShmRegion::Create(name, 4096);
  ASSERT_TRUE(a.ok());
  auto b = ShmRegion::Create(name, 8192);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kAlreadyExists) << b.status();
  // The failed create must not have removed the existing object.
  EXPECT_TRUE(ShmExists(name));
  EXPECT_EQ(a->size(), 4096u);
}

TEST_F(ShmRegionTest, RemoveAndErrors) {
  const std::string name = Name("rm");
  {
    auto a = ShmRegion::Create(name, 4096);
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(ShmRegion::Remove(name).ok());
    EXPECT_FALSE(ShmExists(name));
  }
  EXPECT_TRUE(ShmRegion::Remove(name).ok()) << "removing an absent object is OK";
  EXPECT_EQ(ShmRegion::OpenReadOnly(name).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ShmRegion::Create("no-slash", 10).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmRegion::Create("/a/b", 10).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmRegion::Create(Name("zero"), 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ShmRegionTest, TooLargeForDevShmIsResourceExhaustedAndLeavesNothing) {
  const std::string name = Name("huge");
  // 1 PiB cannot be reserved on any tmpfs.
  auto r = ShmRegion::Create(name, uint64_t{1} << 50);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().code() == absl::StatusCode::kResourceExhausted ||
              r.status().code() == absl::StatusCode::kInternal)
      << r.status();
  EXPECT_FALSE(ShmExists(name));
}

}  // namespace
}  // namespace polykv::ipc
