// Fuzzes the receive side under ASan and UBSan (scripts/fuzz_native.py). Each input is a mutated seed
// message (a file of frames, each a little-endian uint32 length and its bytes). Four targets, a quarter
// of the time each:
//   wire:     the decoders straight: wire::DecodeMessage (told of more frames than it is given, now and
//             then), the shm slot-message decoder, and the sequence accounting with hostile numbers;
//   receiver: the TF-free receiver end to end (receiver.cc over zmq_core.cc), copying and zero-copy, fed
//             over a real ipc socket by a PUSH peer that floods, and disconnects and reconnects;
//   shm:      the shm:// consumer (shm.cc's SlotReader): real regions handed over on its abstract socket by
//             honest and hostile peers, and slot messages resolved into them (fuzz_shm.h);
//   shm_receiver: the receiver over a shm:// endpoint end to end: a region handed over, slot messages
//             over ZMQ, valid or mutated, each batch checked to be the region's bytes;
//   curve:    the receiver as a CURVE server (its ZAP handler and handshake monitor), fed as `receiver` is
//             by peers that hold the client's keys, a stranger's, the wrong server key, or no CURVE at all
//             (the key folder in $FB_FUZZ_KEYS, the stranger's in $FB_FUZZ_STRANGER).
// Usage: fuzz_wire SECONDS SEED DIR FILE...; prints the inputs tried per target (each a fifth of SECONDS).
#include <unistd.h>
#include <zmq.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz_shm.h"
#include "mutate.h"
#include "shm.h"
#include "wire_decode.h"
#include "zmq_core.h"

extern "C" {
void* fb_receiver_open(const char*, int, const int*, const int*, const int64_t*, int, void* const*, int, int64_t,
                       int64_t, int, const char*, int, int, void*, char*, size_t);
int fb_receiver_next(void*, int64_t, char*, size_t);
int fb_receiver_release(void*, int, char*, size_t);
int fb_receiver_data(void*, int, void**, int, char*, size_t);
int fb_receiver_stats(void*, int64_t*, int, int64_t*);
int64_t fb_receiver_bad(void*);
void fb_receiver_close(void*);
}

namespace {

constexpr size_t kCap = 1 << 20;

std::vector<std::string> Split(const unsigned char* p, size_t n) {
  std::vector<std::string> frames;
  size_t at = 0;
  while (at + 4 <= n && frames.size() < 2000) {
    uint32_t len;
    memcpy(&len, p + at, 4);
    at += 4;
    if (len > n - at) len = static_cast<uint32_t>(n - at);
    frames.emplace_back(reinterpret_cast<const char*>(p + at), len);
    at += len;
  }
  if (frames.empty()) frames.emplace_back(reinterpret_cast<const char*>(p), n);
  return frames;
}

void DecodeOne(const std::vector<std::string>& parts, feedbench::core::SeqTracker* seqs) {
  using namespace feedbench;
  std::vector<wire::Frame> frames;
  for (const auto& s : parts) frames.push_back({s.data(), s.size()});
  const size_t total = frames.size() + (fz_below(8) == 0 ? 1 + fz_below(3) : 0);
  bool native = false;
  wire::NativeHeader header;
  std::vector<wire::TensorView> tensors;
  wire::WireError err;
  if (shm::IsSlotMessage(frames)) {
    shm::SlotRef ref;
    shm::DecodeSlotMessage(frames, total, &header, &tensors, &ref, &err);
  } else if (wire::DecodeMessage(frames, total, &native, &header, &tensors, &err)) {
    uint64_t sum = 0;
    for (const auto& t : tensors)
      for (size_t k = 0; k < t.nbytes; k += 4096) sum += static_cast<unsigned char>(t.data[k]);
    if (native) seqs->Add(header.producer_id % 4, fz_below(4) ? header.seq : fz_rand());
    if (sum == 1) fz_state += 1;  // keeps the reads
  }
}

// The keys a CURVE peer may hold (z85 text): the run's client pair and server key, and a stranger's pair.
struct Keys {
  std::string dir, client_pub, client_sec, server_pub, stranger_pub, stranger_sec;
  bool Load(const char* keys, const char* stranger) {
    using feedbench::core::LoadCurveKey;
    std::string unused;
    if (keys == nullptr || stranger == nullptr) return false;
    dir = keys;
    return LoadCurveKey(dir, "client", true, &client_pub, &client_sec).ok() &&
           LoadCurveKey(dir, "server", false, &server_pub, &unused).ok() &&
           LoadCurveKey(stranger, "client", true, &stranger_pub, &stranger_sec).ok();
  }
};

struct Peer {
  void* ctx = zmq_ctx_new();
  void* push = nullptr;
  std::string ep;
  const Keys* keys = nullptr;  // a CURVE server's peer: which keys it holds is drawn at each connect
  void Connect(bool honest = false) {
    if (push) zmq_close(push);
    push = zmq_socket(ctx, ZMQ_PUSH);
    int linger = 0, hwm = 1000;
    zmq_setsockopt(push, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(push, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    if (keys != nullptr) {
      const int wait_ms = 20;  // a peer whose handshake failed has no one to send to
      zmq_setsockopt(push, ZMQ_SNDTIMEO, &wait_ms, sizeof(wait_ms));
      Curve(honest ? 0 : static_cast<int>(fz_below(8)));
    }
    zmq_connect(push, ep.c_str());
  }
  void Curve(int kind) {  // 0-4: the client's keys; 5: a stranger's; 6: the wrong server key; 7: none
    if (kind == 7) return;
    const Keys& k = *keys;
    const std::string& server = kind == 6 ? k.stranger_pub : k.server_pub;
    const std::string& pub = kind == 5 ? k.stranger_pub : k.client_pub;
    const std::string& sec = kind == 5 ? k.stranger_sec : k.client_sec;
    zmq_setsockopt(push, ZMQ_CURVE_SERVERKEY, server.c_str(), 41);
    zmq_setsockopt(push, ZMQ_CURVE_PUBLICKEY, pub.c_str(), 41);
    zmq_setsockopt(push, ZMQ_CURVE_SECRETKEY, sec.c_str(), 41);
  }
  // False when the first part was not taken (timed out: no handshake passed); then none of the rest is sent.
  bool Send(const std::vector<std::string>& parts) {
    for (size_t i = 0; i < parts.size(); ++i)
      if (zmq_send(push, parts[i].data(), parts[i].size(), i + 1 < parts.size() ? ZMQ_SNDMORE : 0) < 0) return false;
    return true;
  }
  ~Peer() {
    zmq_close(push);
    zmq_ctx_term(ctx);
  }
};

// Takes what the receiver has ready, giving every slot back; the batches it accepted.
long Drain(void* r, int zero_copy, int64_t wait_ms) {
  char err[1024];
  long good = 0;
  while (true) {
    const int slot = fb_receiver_next(r, wait_ms, err, sizeof(err));
    if (slot == -1 || slot == -3) return good;
    wait_ms = 0;
    if (slot < 0) continue;
    if (zero_copy) {
      void* ptrs[2];
      if (fb_receiver_data(r, slot, ptrs, 2, err, sizeof(err)) == 0) good += static_cast<unsigned char*>(ptrs[0])[0] < 2;
    }
    fb_receiver_release(r, slot, err, sizeof(err));
    ++good;
  }
}

// The receiver end to end over ipc (a CURVE server when `keys` is given); the messages sent.
long Receive(const fz_buf* seeds, size_t n_seeds, unsigned char* buf, double seconds, const std::string& dir,
             const Keys* keys, long* accepted) {
  const int dtypes[2] = {4, 3}, ndims[2] = {4, 1};
  const int64_t dims[5] = {2, 4, 4, 3, 2};
  std::vector<std::vector<char>> store(4 * 2);
  std::vector<void*> ptrs;
  for (int s = 0; s < 4; ++s) {
    store[2 * s].resize(96);
    store[2 * s + 1].resize(8);
    ptrs.push_back(store[2 * s].data());
    ptrs.push_back(store[2 * s + 1].data());
  }
  long inputs = 0;
  const double end = fz_now() + seconds;
  for (int round = 0; fz_now() < end; ++round) {
    const int zero_copy = round % 2;
    const std::string ep = "ipc://" + dir + "/fz-" + std::to_string(getpid()) + "-" + std::to_string(round) +
                           (keys != nullptr ? "c" : "");
    char err[1024];
    void* r = fb_receiver_open(ep.c_str(), 2, dtypes, ndims, dims, 4, ptrs.data(), 100, 200, 1 << 20, 1,
                               keys != nullptr ? keys->dir.c_str() : nullptr, 1 + round % 2, zero_copy, nullptr, err,
                               sizeof(err));
    if (r == nullptr) {
      fprintf(stderr, "fuzz_wire: %s\n", err);
      return -1;
    }
    Peer peer;
    peer.ep = ep;
    peer.keys = keys;
    peer.Connect(true);  // the client's keys first, so every round gets past the handshake
    const double round_end = fz_now() + 1.0;
    while (fz_now() < round_end && fz_now() < end) {
      const int burst = fz_below(16) == 0 ? 200 : 1;  // now and then a flood
      bool refused = false;  // a CURVE peer the server turned away: nothing it sends is taken
      for (int b = 0; b < burst && !refused; ++b) {
        refused = !peer.Send(Split(buf, fz_mutate(seeds, n_seeds, buf, kCap)));
        inputs += !refused;
      }
      *accepted += Drain(r, zero_copy, burst > 1 ? 50 : 2);
      if (refused || fz_below(64) == 0) peer.Connect();  // a producer that leaves and comes back
    }
    *accepted += Drain(r, zero_copy, 20);
    int64_t rows[20], totals[2];
    fb_receiver_stats(r, rows, 4, totals);
    fb_receiver_bad(r);
    fb_receiver_close(r);
  }
  return inputs;
}

// Takes what the receiver has ready over a shm:// endpoint: each batch must be bytes of the region's
// slots (zero-copy: the very bytes, inside a mapping of it); the batches it accepted.
long DrainShm(void* r, int zero_copy, const shmfz::Region& region, const std::vector<void*>& ptrs) {
  char err[1024];
  long good = 0;
  const char* data = region.map + region.data_offset;
  const size_t room = region.size - region.data_offset;
  for (int64_t wait_ms = 2;; wait_ms = 0) {
    const int slot = fb_receiver_next(r, wait_ms, err, sizeof(err));
    if (slot == -1 || slot == -3) return good;
    if (slot < 0) continue;
    void* got[2] = {ptrs[2 * slot], ptrs[2 * slot + 1]};
    if (zero_copy && fb_receiver_data(r, slot, got, 2, err, sizeof(err)) != 0) shmfz::Breach(err);
    const size_t sizes[2] = {96, 8};
    for (int i = 0; i < 2; ++i) {
      const char* p = static_cast<const char*>(got[i]);
      if (zero_copy) {
        std::lock_guard<std::mutex> lock(shmfz::g_maps_mu);  // the receive thread maps
        auto it = shmfz::g_maps.upper_bound(p);
        if (it == shmfz::g_maps.begin() || p + sizes[i] > (--it)->first + it->second) {
          shmfz::Breach("a zero-copy batch outside every mapping");
        }
        if (memcmp(p, region.map + (p - it->first), sizes[i]) != 0) shmfz::Breach("a zero-copy batch differs");
      } else if (memmem(data, room, p, sizes[i]) == nullptr) {
        shmfz::Breach("a batch that is no slot's bytes");
      }
    }
    fb_receiver_release(r, slot, err, sizeof(err));
    ++good;
  }
}

// The receiver over a shm:// endpoint end to end: a region handed over on its abstract socket, slot
// messages (uint8 [2,4,4,3], int32 [2]) over ZMQ, valid or changed in a field or as bytes.
long ReceiveShm(unsigned char* buf, double seconds, long* accepted) {
  const int dtypes[2] = {4, 3}, ndims[2] = {4, 1};
  const int64_t dims[5] = {2, 4, 4, 3, 2};
  std::vector<std::vector<char>> store(8, std::vector<char>(96));
  std::vector<void*> ptrs;
  for (auto& s : store) ptrs.push_back(s.data());
  long inputs = 0;
  const double end = fz_now() + seconds;
  for (int round = 0; fz_now() < end; ++round) {
    const int zero_copy = round % 2;
    const std::string name = "fzr-" + std::to_string(getpid()) + "-" + std::to_string(round);
    char err[1024];
    void* r = fb_receiver_open(("shm://" + name).c_str(), 2, dtypes, ndims, dims, 4, ptrs.data(), 100, 200, 1 << 20,
                               1, nullptr, 1, zero_copy, reinterpret_cast<void*>(shmfz::Hook), err, sizeof(err));
    if (r == nullptr) shmfz::Breach(err);
    shmfz::Region region;
    const int fd = shmfz::MakeRegion(&region, "/fb-fuzz", 4, 4096, 0);
    region.name = "/fb-" + std::to_string(getpid()) + "-" + shmfz::Hex32();
    const int s = shmfz::Connect("feedbench-" + std::to_string(getuid()) + "/" + name + ".fd");
    if (s < 0) shmfz::Breach("no hand-over socket");
    shmfz::Send(s, "FBHO" + region.name, {fd});
    close(s);
    close(fd);
    Peer peer;
    peer.ep = "ipc://@feedbench-" + std::to_string(getuid()) + "/" + name + ".sock";
    peer.Connect();
    const double round_end = fz_now() + 1.0;
    while (fz_now() < round_end && fz_now() < end) {
      const uint32_t slot = static_cast<uint32_t>(fz_below(4));
      const bool free = __atomic_load_n(region.State(slot), __ATOMIC_ACQUIRE) == 0u;
      std::string head(32, '\0'), desc = "FBSL";
      const uint16_t version = 1, count = 2, name_len = static_cast<uint16_t>(region.name.size());
      memcpy(&head[0], "FBWS", 4);
      memcpy(&head[4], &version, 2);
      memcpy(&head[6], &count, 2);
      const int32_t t0[2] = {4, 4}, t1[2] = {3, 1};
      head.append(reinterpret_cast<const char*>(t0), 8).append(reinterpret_cast<const char*>(dims), 32);
      head.append(reinterpret_cast<const char*>(t1), 8).append(reinterpret_cast<const char*>(dims + 4), 8);
      const uint64_t offsets[2] = {64 * fz_below(3), 128 + 64 * fz_below(60)};
      desc.append(reinterpret_cast<const char*>(&slot), 4).append(reinterpret_cast<const char*>(&name_len), 2);
      desc.append(region.name).append(reinterpret_cast<const char*>(offsets), 16);
      std::string packed;
      for (const std::string* f : {&head, &desc}) {
        const uint32_t len = static_cast<uint32_t>(f->size());
        packed.append(reinterpret_cast<const char*>(&len), 4) += *f;
      }
      const fz_buf one{reinterpret_cast<unsigned char*>(&packed[0]), packed.size()};
      size_t n = packed.size();
      if (fz_below(2)) {
        memcpy(buf, packed.data(), n);  // as the producer sent it
      } else {
        n = fz_mutate(&one, 1, buf, kCap);
      }
      const std::vector<std::string> parts = Split(buf, n);
      std::vector<feedbench::wire::Frame> frames;
      for (const auto& f : parts) frames.push_back({f.data(), f.size()});
      feedbench::wire::NativeHeader header;
      std::vector<feedbench::wire::TensorView> tensors;
      feedbench::shm::SlotRef ref;
      feedbench::wire::WireError werr;
      if (feedbench::shm::IsSlotMessage(frames) &&
          feedbench::shm::DecodeSlotMessage(frames, frames.size(), &header, &tensors, &ref, &werr) &&
          ref.region != region.name) {
        continue;  // a region never handed over: the receiver would wait for it 2 s
      }
      if (free) __atomic_store_n(region.State(slot), 1u, __ATOMIC_RELEASE);
      peer.Send(parts);
      ++inputs;
      *accepted += DrainShm(r, zero_copy, region, ptrs);
    }
    for (int k = 0; k < 20; ++k) *accepted += DrainShm(r, zero_copy, region, ptrs);
    fb_receiver_close(r);
  }
  return inputs;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) return 2;
  const double seconds = atof(argv[1]);
  fz_state ^= strtoull(argv[2], nullptr, 10) * 0x9E3779B97F4A7C15ull;
  const std::string dir = argv[3];
  std::vector<fz_buf> seeds(argc - 4);
  for (size_t i = 0; i < seeds.size(); ++i)
    if (fz_read(argv[4 + i], &seeds[i]) != 0) return 2;
  std::vector<unsigned char> buf(kCap);
  feedbench::core::SeqTracker seqs;
  long decoded = 0;
  const double end = fz_now() + seconds / 5;
  while (fz_now() < end) {
    DecodeOne(Split(buf.data(), fz_mutate(seeds.data(), seeds.size(), buf.data(), kCap)), &seqs);
    ++decoded;
  }
  long resolved = 0, handovers = 0;
  const long slots = shmfz::Run(seeds.data(), seeds.size(), buf.data(), seconds / 5, &resolved, &handovers);
  long shm_accepted = 0;
  const long shm_sent = ReceiveShm(buf.data(), seconds / 5, &shm_accepted);
  long accepted = 0;
  const long received = Receive(seeds.data(), seeds.size(), buf.data(), seconds / 5, dir, nullptr, &accepted);
  Keys keys;
  if (!keys.Load(getenv("FB_FUZZ_KEYS"), getenv("FB_FUZZ_STRANGER"))) {
    fprintf(stderr, "fuzz_wire: no CURVE keys in $FB_FUZZ_KEYS and $FB_FUZZ_STRANGER\n");
    return 2;
  }
  long curve_accepted = 0;
  const long curve_sent = Receive(seeds.data(), seeds.size(), buf.data(), seconds / 5, dir, &keys, &curve_accepted);
  for (auto& s : seeds) free(s.data);
  if (received < 0 || curve_sent < 0) return 1;
  printf("{\"target\": \"wire\", \"inputs\": %ld}\n{\"target\": \"receiver\", \"inputs\": %ld, \"accepted\": %ld}\n",
         decoded, received, accepted);
  printf("{\"target\": \"shm\", \"inputs\": %ld, \"resolved\": %ld, \"handovers\": %ld}\n", slots, resolved,
         handovers);
  printf("{\"target\": \"shm_receiver\", \"inputs\": %ld, \"accepted\": %ld}\n", shm_sent, shm_accepted);
  printf("{\"target\": \"curve\", \"inputs\": %ld, \"accepted\": %ld}\n", curve_sent, curve_accepted);
  return 0;
}
