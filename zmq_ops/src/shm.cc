// Shared-memory slots for shm:// endpoints (see shm.h).

#include "shm.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
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
  *ipc = "ipc://@feedbench-" + std::to_string(getuid()) + "/" + name + ".sock";
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

Mapping::~Mapping() {
  if (hook != nullptr) hook(base, size, 0);
  munmap(base, size);
}

void SlotLease::Release() {
  if (state_ != nullptr) __atomic_store_n(state_, 0u, __ATOMIC_RELEASE);
  state_ = nullptr;
  mapping_.reset();
}

bool SlotReader::AllTaken(uint32_t* slots) {
  std::lock_guard<std::mutex> lock(mu_);
  *slots = 0;
  for (const auto& [name, r] : regions_) {
    for (uint32_t i = 0; i < r.slots; ++i) {
      const auto* state = reinterpret_cast<const uint32_t*>(r.mapping->base + kRegionHeader + kStateStride * i);
      if (__atomic_load_n(state, __ATOMIC_ACQUIRE) != 2u) return false;
    }
    *slots += r.slots;
  }
  return *slots > 0;
}

void SlotReader::Poll() {
  std::lock_guard<std::mutex> lock(mu_);
  DrainHandovers();
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

SlotReader::~SlotReader() {
  if (listen_fd_ >= 0) close(listen_fd_);
  for (auto& [name, fd] : handed_over_) close(fd);
  for (const Peer& peer : peers_) close(peer.fd);
}

bool SlotReader::Listen(const std::string& end_point, std::string* err) {
  const std::string name = end_point.substr(sizeof(kEndpointScheme) - 1);
  if (!ValidName(name)) {
    *err = "endpoint '" + end_point + "': NAME must be 1-64 characters of A-Z a-z 0-9 _ . -";
    return false;
  }
  const std::string path = "feedbench-" + std::to_string(getuid()) + "/" + name + ".fd";
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, path.data(), path.size());  // abstract: a leading NUL, no file
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + path.size());
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 128) != 0) {
    *err = "ZMQ endpoint " + end_point + ": cannot bind: " +
           (errno == EADDRINUSE ? std::string("address already in use") : std::string(strerror(errno)));
    if (fd >= 0) close(fd);
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  listen_fd_ = fd;
  return true;
}

// Accepts every waiting peer and reads those that have sent, never waiting on one: another user's peer
// is closed before anything is read from it, and a peer of this user that sends nothing is dropped after
// kPeerWaitMs (at most kMaxPeers wait at once), so no peer delays another's hand-over.
void SlotReader::DrainHandovers() {
  while (listen_fd_ >= 0) {
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) break;
    ucred cred{};
    socklen_t clen = sizeof(cred);
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 || cred.uid != getuid()) {
      close(conn);
      continue;
    }
    peers_.push_back(Peer{conn, static_cast<long>(cred.pid),
                          std::chrono::steady_clock::now() + std::chrono::milliseconds(kPeerWaitMs)});
    if (ReadPeer(peers_.size() - 1)) peers_.pop_back();  // a producer sends as it connects
    if (peers_.size() > kMaxPeers) {
      close(peers_.front().fd);
      peers_.pop_front();
    }
  }
  for (size_t i = 0; i < peers_.size();) {
    if (ReadPeer(i)) {
      peers_.erase(peers_.begin() + static_cast<long>(i));
    } else {
      ++i;
    }
  }
}

bool SlotReader::ReadPeer(size_t i) {
  const Peer peer = peers_[i];
  char buf[4 + kMaxNameLen + 1];
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))];
  iovec iov{buf, sizeof(buf)};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(peer.fd, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) &&
      std::chrono::steady_clock::now() < peer.drop_at) {
    return false;
  }
  close(peer.fd);
  std::vector<int> fds;
  for (cmsghdr* c = n >= 0 ? CMSG_FIRSTHDR(&m) : nullptr; c != nullptr; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t j = 0; j < k; ++j) {
        int f;
        std::memcpy(&f, CMSG_DATA(c) + j * sizeof(int), sizeof(int));
        fds.push_back(f);
      }
    }
  }
  const std::string name = n > 4 ? std::string(buf + 4, static_cast<size_t>(n) - 4) : std::string();
  const bool ok = n > 4 && (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) == 0 && std::memcmp(buf, "FBHO", 4) == 0 &&
                  fds.size() == 1 && ValidRegionName(name) && RegionPid(name) == peer.pid &&
                  handed_over_.count(name) == 0;
  if (!ok) {
    for (int f : fds) close(f);
    return true;
  }
  handed_over_[name] = fds[0];
  handed_over_order_.push_back(name);
  while (handed_over_.size() > kMaxRegions && !handed_over_order_.empty()) {
    auto it = handed_over_.find(handed_over_order_.front());
    handed_over_order_.pop_front();
    if (it != handed_over_.end()) {
      close(it->second);
      handed_over_.erase(it);
    }
  }
  return true;
}

int SlotReader::TakeHandedOver(const std::string& name, int wait_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  while (true) {
    DrainHandovers();
    auto it = handed_over_.find(name);
    if (it != handed_over_.end()) {
      const int fd = it->second;
      handed_over_.erase(it);
      return fd;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0 || listen_fd_ < 0) return -1;
    std::vector<pollfd> waits{{listen_fd_, POLLIN, 0}};
    for (const Peer& peer : peers_) waits.push_back(pollfd{peer.fd, POLLIN, 0});
    poll(waits.data(), waits.size(), static_cast<int>(std::min<long long>(left, 100)));
  }
}

bool SlotReader::Map(const std::string& name, Region* region, wire::WireError* err) {
  const int fd = TakeHandedOver(name, 2000);
  if (fd < 0) return Fail(err, "slot.region", name + " was never handed over by a producer of this user");
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return Fail(err, "slot.region", name + ": " + strerror(errno));
  }
  if (st.st_uid != getuid()) {
    close(fd);
    return Fail(err, "slot.region", name + " does not belong to this user");
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    close(fd);
    return Fail(err, "slot.region", name + ": its size is not sealed");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < kRegionHeader) {
    close(fd);
    return Fail(err, "region.size", name + " has " + std::to_string(size) + " bytes, less than its header");
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return Fail(err, "slot.region", name + " cannot be mapped: " + strerror(errno));
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
  r.mapping = std::make_shared<Mapping>(static_cast<char*>(base), size, hook_);
  if (hook_ != nullptr) hook_(base, size, 1);
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
