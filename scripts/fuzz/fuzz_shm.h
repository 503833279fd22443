// The shm:// consumer under the sanitizers (included by fuzz_wire.cc): shm::SlotReader as the receive
// core drives it, listening on its real abstract hand-over socket (\0feedbench-<uid>/NAME.fd). Producers
// made here build regions as wire/shm.py does (a sealed memfd labelled fb-<pid>-<hex>, the region header,
// one state word per slot), some of them flawed (unsealed, a wrong header, size or slot count), and hand
// them over as a producer does, or as a hostile peer would: no descriptor, two, a pipe's, a wrong magic,
// another process's label, a name too long, a peer that closes or never sends, a forked producer that
// exits. Each new region of a pid replaces (retires) the last, while leases on the old one may still be
// held. Slot messages naming them are valid, or changed in one field (slot, offsets, shapes, dtypes,
// region) or as bytes, and resolved with SlotReader::Resolve. Checked on every input: a refused message
// gives a field and a reason and claims nothing; a resolved one lies inside its slot of a live mapping
// and reads the producer's very bytes; a valid message always resolves. Any breach aborts.
#ifndef FEEDBENCH_FUZZ_SHM_H_
#define FEEDBENCH_FUZZ_SHM_H_

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "mutate.h"
#include "shm.h"
#include "wire_decode.h"

namespace shmfz {

using feedbench::shm::SlotLease;
using feedbench::shm::SlotReader;
using feedbench::shm::SlotRef;
using feedbench::wire::Frame;
using feedbench::wire::NativeHeader;
using feedbench::wire::TensorView;
using feedbench::wire::WireError;

[[noreturn]] void Breach(const std::string& what) {
  fprintf(stderr, "fuzz_wire: shm: %s\n", what.c_str());
  abort();
}

std::map<const char*, uint64_t> g_maps;  // the readers' live mappings, as their map hook reports them
std::mutex g_maps_mu;

void Hook(void* base, uint64_t size, int mapped) {
  std::lock_guard<std::mutex> lock(g_maps_mu);
  if (mapped) {
    g_maps[static_cast<const char*>(base)] = size;
  } else {
    g_maps.erase(static_cast<const char*>(base));
  }
}

struct Region {  // a producer's region, as wire/shm.py's Region makes it
  std::string name;
  char* map = nullptr;
  size_t size = 0;
  uint32_t slots = 0;
  uint64_t slot_size = 0, data_offset = 0;
  bool good = false;  // made without a flaw: the reader must map it
  ~Region() {
    if (map != nullptr) munmap(map, size);
  }
  uint32_t* State(uint32_t slot) { return reinterpret_cast<uint32_t*>(map + 64 + 64 * slot); }
};

std::string Hex32() {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 32; ++i) s += digits[fz_below(16)];
  return s;
}

// A region of `slots` slots; flaw 0 makes a good one, others one thing a reader must refuse. Its descriptor.
int MakeRegion(Region* r, const std::string& name, uint32_t slots, uint64_t slot_size, int flaw) {
  r->name = name, r->slots = slots, r->slot_size = slot_size, r->good = flaw == 0;
  r->data_offset = (64 + 64 * static_cast<uint64_t>(slots) + 4095) / 4096 * 4096;
  r->size = r->data_offset + slots * slot_size + (flaw == 1 ? 4096 : 0);
  if (flaw == 2) r->size = 40;  // smaller than the header
  const int fd = memfd_create(name.c_str() + 1, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(r->size)) != 0) Breach("memfd: " + std::string(strerror(errno)));
  const int seals = flaw == 3 ? 0 : flaw == 4 ? F_SEAL_SHRINK : F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  if (seals != 0 && fcntl(fd, F_ADD_SEALS, seals) != 0) Breach("seals: " + std::string(strerror(errno)));
  void* m = mmap(nullptr, r->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) Breach("mmap: " + std::string(strerror(errno)));
  r->map = static_cast<char*>(m);
  if (r->size >= 64) {
    const uint32_t version = flaw == 5 ? 2 : 1, n = flaw == 6 ? 0 : flaw == 7 ? 1025 : slots;
    const uint64_t ss = flaw == 8 ? slot_size + 1 : slot_size, off = flaw == 9 ? 0 : r->data_offset;
    memcpy(r->map, flaw == 10 ? "FBSX" : "FBSR", 4);
    memcpy(r->map + 4, &version, 4);
    memcpy(r->map + 8, &n, 4);
    memcpy(r->map + 16, &ss, 8);
    memcpy(r->map + 24, &off, 8);
  }
  for (uint64_t k = r->data_offset; k < r->size; ++k) r->map[k] = static_cast<char>(fz_rand());
  if (flaw == 3 && fz_below(2)) ftruncate(fd, 4096);  // an unsealed region that shrinks under its reader
  return fd;
}

// Connects to the reader's hand-over socket; -1 when it refuses.
int Connect(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path + 1, path.data(), path.size());
  const int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + path.size());
  if (s >= 0 && connect(s, reinterpret_cast<sockaddr*>(&addr), len) == 0) return s;
  if (s >= 0) close(s);
  return -1;
}

void Send(int s, const std::string& msg, const std::vector<int>& fds) {
  iovec iov{const_cast<char*>(msg.data()), msg.size()};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
  if (!fds.empty()) {
    m.msg_control = control;
    m.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  }
  sendmsg(s, &m, MSG_NOSIGNAL);
}

struct Held {  // a lease kept a while, as a zero-copy consumer does, and what it must still read
  std::unique_ptr<SlotLease> lease;
  std::string region;
  uint32_t slot;
  std::vector<TensorView> tensors;
};

class Fuzzer {
 public:
  explicit Fuzzer(const std::string& ep) : path_("feedbench-" + std::to_string(getuid()) + "/" + ep + ".fd") {
    reader_.SetMapHook(Hook);
    std::string err;
    if (!reader_.Listen("shm://" + ep, &err)) Breach("listen: " + err);
  }
  ~Fuzzer() {
    held_.clear();
    for (int s : idle_) close(s);
    for (pid_t p : children_) waitpid(p, nullptr, 0);
  }
  long inputs = 0, resolved = 0, refused = 0, handovers = 0;

  void Step(const fz_buf* seeds, size_t n_seeds, unsigned char* buf) {
    if (live_.empty() || fz_below(24) == 0) HandOver();
    reader_.Poll();
    if (live_.empty()) return;
    Region* r = regions_[live_[fz_below(live_.size())]].get();
    const uint32_t slot = static_cast<uint32_t>(fz_below(r->slots));
    const bool free = __atomic_load_n(r->State(slot), __ATOMIC_ACQUIRE) == 0u;
    std::vector<std::string> frames = Valid(r, slot, free);
    const int how = static_cast<int>(fz_below(4));  // 0 and 3: as the producer sent it
    if (how == 1) Field(&frames, r);
    if (how == 2) frames = Bytes(frames, seeds, n_seeds, buf);
    Resolve(frames, (how == 0 || how == 3) && free ? r : nullptr);
    ++inputs;
    while (held_.size() > 2) Release(fz_below(held_.size()));  // a consumer holds a few batches at most
    if (fz_below(2) == 0) Release(fz_below(held_.size() + 1));
    Tidy();
  }

 private:
  // One hand-over, honest (mostly) or hostile; a good region handed over honestly becomes live.
  void HandOver() {
    ++handovers;
    const int flaw = fz_below(4) == 0 ? 1 + static_cast<int>(fz_below(10)) : 0;
    const int kind = fz_below(3) == 0 ? 1 + static_cast<int>(fz_below(10)) : 0;
    auto r = std::make_unique<Region>();
    const uint32_t slots = 1 + static_cast<uint32_t>(fz_below(4));
    const int fd = MakeRegion(r.get(), "/fb-fuzz", slots, 4096 * (1 + fz_below(2)), flaw);
    const std::string hex = Hex32();
    bool kept = false;
    if (kind == 0 && fz_below(8) == 0) {  // a producer worker of its own: it labels the region with its pid
      const pid_t pid = fork();
      if (pid < 0) Breach("fork");
      if (pid == 0) {
        const int s = Connect(path_);
        if (s >= 0) Send(s, "FBHO/fb-" + std::to_string(getpid()) + "-" + hex, {fd});
        _exit(s >= 0 ? 0 : 1);
      }
      siginfo_t info{};
      waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT);  // a zombie: alive to the reader
      children_.push_back(pid);
      r->name = "/fb-" + std::to_string(pid) + "-" + hex;
      kept = info.si_status == 0;
    } else {
      r->name = "/fb-" + std::to_string(kind == 5 ? getppid() : getpid()) + "-" + hex;
      const int s = Connect(path_);
      if (s >= 0) kept = Deliver(s, kind, fd, r->name);
      if (kind == 8) r->good = false;
    }
    close(fd);
    if (!kept) return;
    if (r->good) live_.push_back(r->name);
    regions_[r->name] = std::move(r);
  }

  // Sends over connection `s` as `kind` says (0: honestly); true if the reader must keep the descriptor.
  bool Deliver(int s, int kind, int fd, const std::string& name) {
    int p[2] = {-1, -1};
    std::vector<int> fds{fd};
    std::string msg = "FBHO" + name;
    switch (kind) {
      case 1: fds.clear(); break;                     // no descriptor
      case 2: fds.push_back(fd); break;               // two
      case 3: msg[0] = 'X'; break;                    // a wrong magic
      case 4: msg += std::string(80, 'a'); break;     // too long: truncated
      case 6: close(s); return false;                 // closes mid-hand-over
      case 7: idle_.push_back(s); return false;       // connects and never sends
      case 8: if (pipe(p) == 0) fds = {p[0]}; break;  // a pipe under a region's name: kept, never mapped
      case 9: msg = "FBHO"; break;                    // no name
      case 10: msg = "FBHO" + name.substr(0, name.size() - 1) + "G"; break;  // not a region name
      default: break;                                 // 0, and 5: another process's label
    }
    Send(s, msg, fds);
    close(s);
    if (p[0] >= 0) close(p[0]), close(p[1]);
    return kind == 0 || kind == 8;
  }

  // A slot message as a producer sends it for `slot` of `r`, which it publishes first if `publish`.
  std::vector<std::string> Valid(Region* r, uint32_t slot, bool publish) {
    const int n = 1 + static_cast<int>(fz_below(3));
    static const int dtypes[] = {1, 2, 3, 4, 5, 6, 9, 10, 17, 19, 22, 23};
    std::string head(32, '\0'), desc = "FBSL";
    memcpy(&head[0], "FBWS", 4);
    const uint16_t version = 1, count = static_cast<uint16_t>(n);
    memcpy(&head[4], &version, 2);
    memcpy(&head[6], &count, 2);
    uint64_t at = 0;
    std::vector<uint64_t> offsets;
    for (int i = 0; i < n; ++i) {
      const int32_t dtype = dtypes[fz_below(12)], ndim = static_cast<int32_t>(fz_below(3));
      head.append(reinterpret_cast<const char*>(&dtype), 4).append(reinterpret_cast<const char*>(&ndim), 4);
      uint64_t nbytes = feedbench::wire::ItemSize(dtype);
      for (int d = 0; d < ndim; ++d) {
        const int64_t dim = static_cast<int64_t>(fz_below(9));
        head.append(reinterpret_cast<const char*>(&dim), 8);
        nbytes *= static_cast<uint64_t>(dim);
      }
      offsets.push_back(at);
      at = (at + nbytes + 63) / 64 * 64;
    }
    const uint16_t name_len = static_cast<uint16_t>(r->name.size());
    desc.append(reinterpret_cast<const char*>(&slot), 4).append(reinterpret_cast<const char*>(&name_len), 2);
    desc += r->name;
    for (uint64_t off : offsets) desc.append(reinterpret_cast<const char*>(&off), 8);
    if (publish) __atomic_store_n(r->State(slot), 1u, __ATOMIC_RELEASE);  // filled, then published
    return {head, desc};
  }

  // One field of a valid message set to a value on a bound, or to another region's.
  void Field(std::vector<std::string>* frames, Region* r) {
    static const uint64_t bounds[] = {0, 1, 63, 64, 4095, 4096, 4097, 8191, 8192, 0xffffffffull, 1ull << 63, ~0ull};
    std::string& desc = (*frames)[1];
    const size_t name_at = 10, offs_at = 10 + r->name.size();
    const uint64_t v = fz_below(4) ? bounds[fz_below(12)] : fz_rand();
    switch (fz_below(5)) {
      case 0: memcpy(&desc[4], &v, 4); break;  // the slot
      case 1:
        if (desc.size() > offs_at) memcpy(&desc[offs_at + 8 * fz_below((desc.size() - offs_at) / 8)], &v, 8);
        break;
      case 2: {  // a dimension or a dtype, or the tensor count
        std::string& head = (*frames)[0];
        const size_t at = 32 + 4 * fz_below((head.size() - 32) / 4 + 1);
        if (at + 4 <= head.size()) memcpy(&head[at], &v, fz_below(2) ? 4 : std::min<size_t>(8, head.size() - at));
        if (fz_below(4) == 0) head[6] = static_cast<char>(v);
        break;
      }
      case 3:  // another region: a retired one, one never handed over, or a live one
        if (!regions_.empty()) {
          auto it = regions_.begin();
          std::advance(it, static_cast<long>(fz_below(regions_.size())));
          if (it->first.size() == r->name.size()) desc.replace(name_at, r->name.size(), it->first);
        }
        break;
      default: desc[name_at + fz_below(r->name.size())] = static_cast<char>(v); break;  // a byte of the name
    }
  }

  // The valid message mutated as bytes (the engine fuzz_wire uses), beside the other seeds.
  std::vector<std::string> Bytes(const std::vector<std::string>& frames, const fz_buf* seeds, size_t n_seeds,
                                 unsigned char* buf) {
    std::string packed;
    for (const auto& f : frames) {
      const uint32_t len = static_cast<uint32_t>(f.size());
      packed.append(reinterpret_cast<const char*>(&len), 4) += f;
    }
    std::vector<fz_buf> pool(4, fz_buf{reinterpret_cast<unsigned char*>(&packed[0]), packed.size()});
    if (n_seeds) pool.push_back(seeds[fz_below(n_seeds)]);
    const size_t n = fz_mutate(pool.data(), pool.size(), buf, 1 << 16);
    std::vector<std::string> out;
    size_t at = 0;
    while (at + 4 <= n && out.size() < 4) {
      uint32_t len;
      memcpy(&len, buf + at, 4);
      at += 4;
      if (len > n - at) len = static_cast<uint32_t>(n - at);
      out.emplace_back(reinterpret_cast<const char*>(buf + at), len);
      at += len;
    }
    return out;
  }

  bool Resolvable(const std::string& region) {  // mapped, or handed over and not yet mapped: no 2 s wait
    return regions_.count(region) != 0 && !reader_.Retired(region);
  }

  // Decodes and resolves one message; `valid`: the region it names untouched, which it must resolve in.
  void Resolve(const std::vector<std::string>& parts, Region* valid) {
    std::vector<Frame> frames;
    for (const auto& p : parts) frames.push_back({p.data(), p.size()});
    NativeHeader header;
    std::vector<TensorView> tensors;
    SlotRef ref;
    WireError err;
    if (!feedbench::shm::IsSlotMessage(frames) ||
        !feedbench::shm::DecodeSlotMessage(frames, frames.size(), &header, &tensors, &ref, &err)) {
      if (valid != nullptr) Breach("a valid slot message was refused: " + err.ToString());
      ++refused;
      return;
    }
    if (!Resolvable(ref.region)) {  // the receive core skips retired regions; an unknown one costs 2 s
      ++refused;
      return;
    }
    Region* r = regions_[ref.region].get();
    const uint32_t before = ref.slot < r->slots ? __atomic_load_n(r->State(ref.slot), __ATOMIC_ACQUIRE) : 0;
    auto lease = std::make_unique<SlotLease>();
    if (!reader_.Resolve(ref, &tensors, lease.get(), &err)) {
      if (valid != nullptr && valid->good) Breach("a valid slot message did not resolve: " + err.ToString());
      if (err.field.empty() || err.message.empty() || lease->held()) Breach("a refusal without a reason");
      if (ref.slot < r->slots && __atomic_load_n(r->State(ref.slot), __ATOMIC_ACQUIRE) != before) {
        Breach("a refused message changed its slot's state");
      }
      if (!r->good) regions_.erase(ref.region);  // its descriptor is spent: naming it again would wait
      ++refused;
      return;
    }
    if (!r->good) Breach("a flawed region was mapped: " + ref.region);
    Check(r, ref.slot, tensors);
    ++resolved;
    if (__atomic_load_n(r->State(ref.slot), __ATOMIC_ACQUIRE) != 2u) Breach("a resolved slot is not taken");
    held_.push_back(Held{std::move(lease), ref.region, ref.slot, tensors});
  }

  // Each tensor lies inside its slot of a mapping the reader holds, and reads the producer's very bytes.
  void Check(Region* r, uint32_t slot, const std::vector<TensorView>& tensors) {
    std::lock_guard<std::mutex> lock(g_maps_mu);
    for (const TensorView& t : tensors) {
      auto it = g_maps.upper_bound(t.data - (t.nbytes == 0 ? 1 : 0));  // an empty one may sit at a mapping's end
      if (it == g_maps.begin()) Breach("a tensor outside every mapping");
      --it;
      const char* start = it->first + r->data_offset + slot * r->slot_size;
      if (t.data < start || t.nbytes > r->slot_size || t.data + t.nbytes > start + r->slot_size) {
        Breach("a tensor outside its slot");
      }
      const size_t at = static_cast<size_t>(t.data - it->first);
      if (it->second != r->size || memcmp(t.data, r->map + at, t.nbytes) != 0) Breach("a tensor's bytes differ");
    }
  }

  void Release(size_t i) {
    if (i >= held_.size()) return;
    Held& h = held_[i];
    auto it = regions_.find(h.region);
    if (it == regions_.end()) Breach("a lease outlived its region's record");
    Check(it->second.get(), h.slot, h.tensors);  // still mapped, and the same bytes, though maybe retired
    Region* r = it->second.get();
    const uint32_t slot = h.slot;
    held_.erase(held_.begin() + static_cast<long>(i));
    if (__atomic_load_n(r->State(slot), __ATOMIC_ACQUIRE) != 0u) Breach("a released slot is not free");
  }

  void Forget(const std::string& name) {
    for (size_t i = 0; i < live_.size(); ++i) {
      if (live_[i] == name) live_.erase(live_.begin() + static_cast<long>(i));
    }
  }

  // Drops the records of retired regions no lease holds, and of flawed ones past a few; reaps a child now
  // and then (its region is retired once another is mapped).
  void Tidy() {
    size_t flawed = 0;
    for (auto it = regions_.begin(); it != regions_.end();) {
      bool leased = false;
      for (const Held& h : held_) leased = leased || h.region == it->first;
      const bool retired = reader_.Retired(it->first);
      if (retired) Forget(it->first);
      if ((retired && !leased) || (!it->second->good && ++flawed > 16)) {
        it = regions_.erase(it);
      } else {
        ++it;
      }
    }
    if (!children_.empty() && fz_below(32) == 0) {
      waitpid(children_.front(), nullptr, 0);
      children_.erase(children_.begin());
    }
    while (idle_.size() > 8) {
      close(idle_.front());
      idle_.erase(idle_.begin());
    }
  }

  SlotReader reader_;
  std::string path_;
  std::map<std::string, std::unique_ptr<Region>> regions_;  // kept hand-overs, by name
  std::vector<std::string> live_;                           // good ones not retired: valid messages name these
  std::vector<Held> held_;
  std::vector<int> idle_;
  std::vector<pid_t> children_;
};

int OpenDescriptors() {
  DIR* d = opendir("/proc/self/fd");
  int n = 0;
  while (d != nullptr && readdir(d) != nullptr) ++n;
  if (d != nullptr) closedir(d);
  return n;
}

// Runs the shm fuzzer for `seconds`; the inputs tried (slot messages resolved or refused). Every
// descriptor handed over, kept or refused, is closed once the reader is gone.
long Run(const fz_buf* seeds, size_t n_seeds, unsigned char* buf, double seconds, long* resolved, long* handovers) {
  const int open_before = OpenDescriptors();
  long inputs = 0;
  {
    Fuzzer fz("fz-" + std::to_string(getpid()));
    const double end = fz_now() + seconds;
    while (fz_now() < end) fz.Step(seeds, n_seeds, buf);
    *resolved = fz.resolved, *handovers = fz.handovers, inputs = fz.inputs;
  }
  const int leaked = OpenDescriptors() - open_before;
  if (leaked != 0) Breach("descriptors leaked: " + std::to_string(leaked));
  if (!g_maps.empty()) Breach("a region still mapped after its reader and leases are gone");
  return inputs;
}

}  // namespace shmfz

#endif
