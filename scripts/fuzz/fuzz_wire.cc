// Fuzzes the receive side under ASan and UBSan (scripts/fuzz_native.py). Each input is a mutated seed
// message (a file of frames, each a little-endian uint32 length and its bytes). Three targets, a third of
// the time each:
//   wire:     the decoders straight: wire::DecodeMessage (told of more frames than it is given, now and
//             then), the shm slot-message decoder, and the sequence accounting with hostile numbers;
//   receiver: the TF-free receiver end to end (receiver.cc over zmq_core.cc), copying and zero-copy, fed
//             over a real ipc socket by a PUSH peer that floods, and disconnects and reconnects;
//   shm:      the shm:// consumer (shm.cc's SlotReader): real regions handed over on its abstract socket by
//             honest and hostile peers, and slot messages resolved into them (fuzz_shm.h).
// Usage: fuzz_wire SECONDS SEED DIR FILE...; prints the inputs tried per target.
#include <unistd.h>
#include <zmq.h>

#include <cstdio>
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

struct Peer {
  void* ctx = zmq_ctx_new();
  void* push = nullptr;
  std::string ep;
  void Connect() {
    if (push) zmq_close(push);
    push = zmq_socket(ctx, ZMQ_PUSH);
    int linger = 0, hwm = 1000;
    zmq_setsockopt(push, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(push, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_connect(push, ep.c_str());
  }
  void Send(const std::vector<std::string>& parts) {
    for (size_t i = 0; i < parts.size(); ++i)
      zmq_send(push, parts[i].data(), parts[i].size(), i + 1 < parts.size() ? ZMQ_SNDMORE : 0);
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

long Receive(const fz_buf* seeds, size_t n_seeds, unsigned char* buf, double seconds, const std::string& dir,
             long* accepted) {
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
    const std::string ep = "ipc://" + dir + "/fz-" + std::to_string(getpid()) + "-" + std::to_string(round);
    char err[1024];
    void* r = fb_receiver_open(ep.c_str(), 2, dtypes, ndims, dims, 4, ptrs.data(), 100, 200, 1 << 20, 1, nullptr,
                               1 + round % 2, zero_copy, nullptr, err, sizeof(err));
    if (r == nullptr) {
      fprintf(stderr, "fuzz_wire: %s\n", err);
      return -1;
    }
    Peer peer;
    peer.ep = ep;
    peer.Connect();
    const double round_end = fz_now() + 1.0;
    while (fz_now() < round_end && fz_now() < end) {
      const int burst = fz_below(16) == 0 ? 200 : 1;  // now and then a flood
      for (int b = 0; b < burst; ++b) {
        peer.Send(Split(buf, fz_mutate(seeds, n_seeds, buf, kCap)));
        ++inputs;
      }
      *accepted += Drain(r, zero_copy, burst > 1 ? 50 : 2);
      if (fz_below(64) == 0) peer.Connect();  // a producer that leaves and comes back
    }
    *accepted += Drain(r, zero_copy, 20);
    int64_t rows[20], totals[2];
    fb_receiver_stats(r, rows, 4, totals);
    fb_receiver_bad(r);
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
  const double end = fz_now() + seconds / 3;
  while (fz_now() < end) {
    DecodeOne(Split(buf.data(), fz_mutate(seeds.data(), seeds.size(), buf.data(), kCap)), &seqs);
    ++decoded;
  }
  long resolved = 0, handovers = 0;
  const long slots = shmfz::Run(seeds.data(), seeds.size(), buf.data(), seconds / 3, &resolved, &handovers);
  long accepted = 0;
  const long received = Receive(seeds.data(), seeds.size(), buf.data(), seconds / 3, dir, &accepted);
  for (auto& s : seeds) free(s.data);
  if (received < 0) return 1;
  printf("{\"target\": \"wire\", \"inputs\": %ld}\n{\"target\": \"receiver\", \"inputs\": %ld, \"accepted\": %ld}\n",
         decoded, received, accepted);
  printf("{\"target\": \"shm\", \"inputs\": %ld, \"resolved\": %ld, \"handovers\": %ld}\n", slots, resolved,
         handovers);
  return 0;
}
