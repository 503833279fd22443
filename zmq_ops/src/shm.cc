// Shared-memory slots for shm:// endpoints (see shm.h).

#include "shm.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace feedbench {
namespace shm {
namespace {

template <typename T>
T Read(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

bool Fail(wire::WireError* err, std::string field, std::string message) {
  err->field = std::move(field);
  err->message = std::move(message);
  return false;
}

// /fb-<digits>-<32 lowercase hex>: what producers create, nothing else.
bool ValidRegionName(const std::string& n) {
  if (n.size() > kMaxNameLen || n.compare(0, 4, "/fb-") != 0) return false;
  size_t i = 4, digits = 0;
  while (i < n.size() && n[i] >= '0' && n[i] <= '9') ++i, ++digits;
  if (digits == 0 || i >= n.size() || n[i] != '-') return false;
  const std::string hex = n.substr(i + 1);
  if (hex.size() != 32) return false;
  for (char c : hex) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// The producer worker's pid in /fb-<pid>-<hex> (a valid region name).
long RegionPid(const std::string& n) { return std::strtol(n.c_str() + 4, nullptr, 10); }

// False once the process has exited (and been reaped).
bool Alive(long pid) { return kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH; }

bool ValidName(const std::string& n) {
  if (n.empty() || n.size() > kMaxNameLen) return false;
  for (char c : n) {
    if (!(isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  }
  return n != "." && n != "..";
}

}  // namespace

bool IsShmEndpoint(const std::string& end_point) { return end_point.rfind(kEndpointScheme, 0) == 0; }

bool ZmqEndpoint(const std::string& end_point, std::string* ipc, std::string* err) {
  const std::string name = end_point.substr(sizeof(kEndpointScheme) - 1);
  if (!ValidName(name)) {
    *err = "endpoint '" + end_point + "': NAME must be 1-64 characters of A-Z a-z 0-9 _ . -";
    return false;
  }
  const std::string dir = "/tmp/feedbench-" + std::to_string(getuid());
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    *err = "endpoint '" + end_point + "': cannot create " + dir + ": " + strerror(errno);
    return false;
  }
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077) != 0) {
    *err = "endpoint '" + end_point + "': " + dir + " must be a folder of yours that only you can enter (mode 0700)";
    return false;
  }
  *ipc = "ipc://" + dir + "/" + name + ".sock";
  return true;
}

bool IsSlotMessage(const std::vector<wire::Frame>& frames) {
  return !frames.empty() && frames[0].size >= 4 && std::memcmp(frames[0].data, wire::kSlotMagic, 4) == 0;
}

bool DecodeSlotMessage(const std::vector<wire::Frame>& frames, size_t total_frames, wire::NativeHeader* header,
                       std::vector<wire::TensorView>* tensors, SlotRef* ref, wire::WireError* err) {
  if (total_frames != 2 || frames.size() != 2) {
    return Fail(err, "frames", "a slot message has 2 frames (header, slot), got " + std::to_string(total_frames));
  }
  if (!wire::DecodeNativeHeader(frames[0], wire::kSlotMagic, header, tensors, err)) return false;
  const char* buf = frames[1].data;
  const size_t size = frames[1].size;
  if (size < 10) return Fail(err, "slot.length", std::to_string(size) + " bytes, shorter than the 10-byte fixed part");
  if (std::memcmp(buf, kDescriptorMagic, 4) != 0) return Fail(err, "slot.magic", "not b'FBSL'");
  ref->slot = Read<uint32_t>(buf + 4);
  const uint16_t name_len = Read<uint16_t>(buf + 8);
  const size_t n = tensors->size();
  if (size != 10 + static_cast<size_t>(name_len) + 8 * n) {
    return Fail(err, "slot.length",
                std::to_string(size) + " bytes, expected " + std::to_string(10 + name_len + 8 * n) + " for a " +
                    std::to_string(name_len) + "-byte region name and " + std::to_string(n) + " tensors");
  }
  ref->region.assign(buf + 10, name_len);
  if (!ValidRegionName(ref->region)) return Fail(err, "slot.region", "not a feedbench region name");
  ref->offsets.resize(n);
  for (size_t i = 0; i < n; ++i) {
    ref->offsets[i] = Read<uint64_t>(buf + 10 + name_len + 8 * i);
    wire::TensorView& t = (*tensors)[i];
    uint64_t nbytes = 0;
    if (!wire::TensorBytes(t, &nbytes)) {
      return Fail(err, "tensor[" + std::to_string(i) + "].shape", "no array can be that large");
    }
    t.nbytes = nbytes;
  }
  return true;
}

Mapping::~Mapping() { munmap(base, size); }

void SlotLease::Release() {
  if (state_ != nullptr) __atomic_store_n(state_, 0u, __ATOMIC_RELEASE);
  state_ = nullptr;
  mapping_.reset();
}

bool SlotReader::Retired(const std::string& region) {
  std::lock_guard<std::mutex> lock(mu_);
  return retired_.count(region) != 0;
}

void SlotReader::Prune(const std::string& added) {
  const long pid = RegionPid(added);
  for (auto it = regions_.begin(); it != regions_.end();) {
    const long owner = RegionPid(it->first);
    if (owner == pid || !Alive(owner)) {
      retired_.insert(it->first);
      retired_order_.push_back(it->first);
      if (retired_order_.size() > kMaxRetired) {
        retired_.erase(retired_order_.front());
        retired_order_.pop_front();
      }
      it = regions_.erase(it);  // unmapped now, or when the last lease on it is released
    } else {
      ++it;
    }
  }
}

bool SlotReader::Map(const std::string& name, Region* region, wire::WireError* err) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return Fail(err, "slot.region", name + " cannot be opened: " + strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return Fail(err, "slot.region", name + ": " + strerror(errno));
  }
  if (st.st_uid != getuid() || (st.st_mode & 077) != 0) {
    close(fd);
    return Fail(err, "slot.region", name + " is not private to this user (mode 0600)");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < kRegionHeader) {
    close(fd);
    return Fail(err, "region.size", name + " has " + std::to_string(size) + " bytes, less than its header");
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return Fail(err, "slot.region", name + " cannot be mapped: " + strerror(errno));
  // Mapped: the name is no longer needed, and removing it now means nothing
  // is left in /dev/shm however the producer or this process ends.
  shm_unlink(name.c_str());
  const char* h = static_cast<const char*>(base);
  Region r;
  r.slots = Read<uint32_t>(h + 8);
  r.slot_size = Read<uint64_t>(h + 16);
  r.data_offset = Read<uint64_t>(h + 24);
  std::string field, why;
  const uint64_t expected_offset = (kRegionHeader + kStateStride * r.slots + kPage - 1) / kPage * kPage;
  uint64_t total = 0;
  if (std::memcmp(h, kRegionMagic, 4) != 0) {
    field = "region.magic", why = "not b'FBSR'";
  } else if (Read<uint32_t>(h + 4) != kRegionVersion) {
    field = "region.version", why = "unknown version " + std::to_string(Read<uint32_t>(h + 4));
  } else if (r.slots < 1 || r.slots > kMaxSlots) {
    field = "region.slots", why = std::to_string(r.slots) + " is outside 1.." + std::to_string(kMaxSlots);
  } else if (r.slot_size == 0 || r.slot_size % kPage != 0) {
    field = "region.slot_size", why = std::to_string(r.slot_size) + " is not a positive multiple of 4096";
  } else if (r.data_offset != expected_offset) {
    field = "region.data_offset", why = std::to_string(r.data_offset) + " is not " + std::to_string(expected_offset);
  } else if (__builtin_mul_overflow(r.slot_size, static_cast<uint64_t>(r.slots), &total) ||
             __builtin_add_overflow(total, r.data_offset, &total) || total != size) {
    field = "region.size", why = std::to_string(size) + " bytes do not hold " + std::to_string(r.slots) + " slots of " +
                                 std::to_string(r.slot_size);
  }
  if (!field.empty()) {
    munmap(base, size);
    return Fail(err, field, name + ": " + why);
  }
  r.mapping = std::make_shared<Mapping>(static_cast<char*>(base), size);
  *region = r;
  return true;
}

bool SlotReader::Resolve(const SlotRef& ref, std::vector<wire::TensorView>* tensors, SlotLease* lease,
                         wire::WireError* err) {
  Region r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(ref.region);
    if (it == regions_.end()) {
      if (!Map(ref.region, &r, err)) return false;
      Prune(ref.region);  // only once mapped: a name that cannot be mapped retires nothing
      if (regions_.size() >= kMaxRegions) {
        return Fail(err, "slot.region",
                    "more than " + std::to_string(kMaxRegions) + " live producers' regions mapped");
      }
      regions_[ref.region] = r;
    } else {
      r = it->second;
    }
  }
  char* const base = r.mapping->base;
  if (ref.slot >= r.slots) {
    return Fail(err, "slot.index", std::to_string(ref.slot) + " >= the region's " + std::to_string(r.slots) + " slots");
  }
  if (ref.offsets.size() != tensors->size()) return Fail(err, "slot.length", "one offset per tensor");
  char* slot = base + r.data_offset + static_cast<uint64_t>(ref.slot) * r.slot_size;
  for (size_t i = 0; i < tensors->size(); ++i) {
    wire::TensorView& t = (*tensors)[i];
    uint64_t end = 0;
    if (__builtin_add_overflow(ref.offsets[i], static_cast<uint64_t>(t.nbytes), &end) || end > r.slot_size) {
      return Fail(err, "tensor[" + std::to_string(i) + "].offset",
                  std::to_string(ref.offsets[i]) + " + " + std::to_string(t.nbytes) + " bytes overrun the " +
                      std::to_string(r.slot_size) + "-byte slot");
    }
    t.data = slot + ref.offsets[i];
  }
  // Claim the slot (published -> taken), so a repeated slot message can never
  // have two readers, or a reader of a slot the producer is rewriting.
  auto* state = reinterpret_cast<uint32_t*>(base + kRegionHeader + kStateStride * ref.slot);
  uint32_t published = 1;
  if (!__atomic_compare_exchange_n(state, &published, 2u, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    return Fail(err, "slot.state",
                "slot " + std::to_string(ref.slot) + " of " + ref.region + " is not published (state " +
                    std::to_string(published) + ")");
  }
  lease->state_ = state;
  lease->mapping_ = r.mapping;
  return true;
}

}  // namespace shm
}  // namespace feedbench
