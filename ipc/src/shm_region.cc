// POSIX shared-memory regions for host pools (Boost.Interprocess shared_memory_object +
// mapped_region). The owner reserves the pages with posix_fallocate so a full /dev/shm is
// an error at create time, never a SIGBUS while writing.
#include "polykv/ipc/shm_region.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace polykv::ipc {

namespace bip = boost::interprocess;

struct ShmRegion::Impl {
  std::string name;
  bool owner = false;
  bip::shared_memory_object shm;
  bip::mapped_region region;
  ~Impl() {
    region = bip::mapped_region();
    shm = bip::shared_memory_object();
    if (owner) bip::shared_memory_object::remove(name.c_str());
  }
};

namespace {

Status ValidateName(const std::string& name) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos ||
      name.size() > 250) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shm name \"", name, "\" must be \"/<name>\" with no further '/' and < 250 chars"));
  }
  return absl::OkStatus();
}

Status FromBoost(const bip::interprocess_exception& e, const std::string& name,
                 const std::string& what) {
  std::string msg = absl::StrCat(what, " shm object ", name, ": ", e.what());
  switch (e.get_error_code()) {
    case bip::already_exists_error:
      return absl::AlreadyExistsError(msg);
    case bip::not_found_error:
      return absl::NotFoundError(msg);
    case bip::security_error:
      return absl::PermissionDeniedError(msg);
    case bip::out_of_space_error:
    case bip::out_of_memory_error:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace

ShmRegion::ShmRegion() : impl_(std::make_unique<Impl>()) {}
ShmRegion::ShmRegion(ShmRegion&&) noexcept = default;
ShmRegion& ShmRegion::operator=(ShmRegion&&) noexcept = default;
ShmRegion::~ShmRegion() = default;

StatusOr<ShmRegion> ShmRegion::Create(const std::string& name, uint64_t size) {
  POLYKV_RETURN_IF_ERROR(ValidateName(name));
  if (size == 0) return absl::InvalidArgumentError("shm region size must be > 0");
  ShmRegion r;
  r.impl_->name = name;
  try {
    bip::permissions perms(0640);
    r.impl_->shm =
        bip::shared_memory_object(bip::create_only, name.c_str(), bip::read_write, perms);
  } catch (const bip::interprocess_exception& e) {
    return FromBoost(e, name, "create");
  }
  r.impl_->owner = true;  // from here on the destructor unlinks
  // Boost applies the umask-free mode via fchmod only on some versions; make sure.
  int fd = r.impl_->shm.get_mapping_handle().handle;
  (void)fchmod(fd, 0640);
  try {
    r.impl_->shm.truncate(static_cast<bip::offset_t>(size));
  } catch (const bip::interprocess_exception& e) {
    return FromBoost(e, name, "size");
  }
  if (int rc = posix_fallocate(fd, 0, static_cast<off_t>(size)); rc != 0) {
    std::string msg =
        absl::StrCat("reserve ", size, " bytes for shm object ", name, ": ", std::strerror(rc));
    if (rc == ENOSPC || rc == ENOMEM) return absl::ResourceExhaustedError(msg);
    if (rc != EINVAL && rc != EOPNOTSUPP) return absl::InternalError(msg);
  }
  try {
    r.impl_->region = bip::mapped_region(r.impl_->shm, bip::read_write);
  } catch (const bip::interprocess_exception& e) {
    return FromBoost(e, name, "map");
  }
  return r;
}

StatusOr<ShmRegion> ShmRegion::OpenReadOnly(const std::string& name) {
  POLYKV_RETURN_IF_ERROR(ValidateName(name));
  ShmRegion r;
  r.impl_->name = name;
  try {
    r.impl_->shm = bip::shared_memory_object(bip::open_only, name.c_str(), bip::read_only);
    bip::offset_t size = 0;
    if (!r.impl_->shm.get_size(size) || size <= 0) {
      return absl::DataLossError(absl::StrCat("shm object ", name, " is empty"));
    }
    r.impl_->region = bip::mapped_region(r.impl_->shm, bip::read_only);
  } catch (const bip::interprocess_exception& e) {
    return FromBoost(e, name, "open");
  }
  return r;
}

Status ShmRegion::Remove(const std::string& name) {
  POLYKV_RETURN_IF_ERROR(ValidateName(name));
  if (shm_unlink(name.c_str()) != 0 && errno != ENOENT) {
    return absl::InternalError(
        absl::StrCat("remove shm object ", name, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

void* ShmRegion::data() const { return impl_ ? impl_->region.get_address() : nullptr; }
uint64_t ShmRegion::size() const { return impl_ ? impl_->region.get_size() : 0; }
const std::string& ShmRegion::name() const {
  static const std::string kEmpty;
  return impl_ ? impl_->name : kEmpty;
}
bool ShmRegion::owner() const { return impl_ && impl_->owner; }

}  // namespace polykv::ipc
