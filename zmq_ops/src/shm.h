// Shared-memory slots for shm://NAME endpoints (the consumer's side).
//
// Design (docs/wire.md, "Shared memory"; Python side: wire/shm.py): each
// producer worker owns a region, an anonymous memory file (memfd_create,
// labelled fb-<pid>-<32 random hex>, its size sealed) of N slots. It hands
// the region's descriptor to the consumer over a unix socket (SCM_RIGHTS, on
// an abstract address derived from NAME) before its first slot message, so no
// region ever has a name in /dev/shm and the kernel frees it when the last
// process holding it ends, however it ends. The producer writes a whole batch
// into a free slot, marks it published and only then sends a small slot
// message over ZMQ. The consumer checks every field of the slot message
// against the region before it reads a byte, claims the slot, and marks it
// free again when it is done with it (after a copy, or when the last tensor
// over the slot is dropped).
//
// Nothing here depends on TensorFlow.

#ifndef FEEDBENCH_ZMQ_OPS_SHM_H_
#define FEEDBENCH_ZMQ_OPS_SHM_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "wire_decode.h"

namespace feedbench {
namespace shm {

constexpr char kEndpointScheme[] = "shm://";
constexpr char kDescriptorMagic[4] = {'F', 'B', 'S', 'L'};
constexpr char kRegionMagic[4] = {'F', 'B', 'S', 'R'};
constexpr uint32_t kRegionVersion = 1;
constexpr uint32_t kMaxSlots = 1024;
constexpr size_t kMaxNameLen = 64;
constexpr size_t kMaxRegions = 256;  // regions one consumer maps at once (live producer workers)
constexpr size_t kMaxRetired = 4096;  // unmapped regions remembered, to skip their late slot messages
constexpr size_t kMaxPeers = 64;  // hand-over peers that connected and have not sent yet; the oldest goes past it
constexpr int kPeerWaitMs = 5000;  // such a peer is dropped after this long
constexpr size_t kRegionHeader = 64;
constexpr size_t kStateStride = 64;  // one cache line per slot state
constexpr size_t kPage = 4096;

// Where a slot message says its batch is.
struct SlotRef {
  uint32_t slot = 0;
  std::string region;
  std::vector<uint64_t> offsets;  // per tensor, from the slot's start
};

// True for shm://NAME.
bool IsShmEndpoint(const std::string& end_point);
// The ipc:// endpoint that carries shm://NAME's slot messages: an abstract
// unix address (no file), ipc://@feedbench-<uid>/NAME.sock. False with `err`
// naming the endpoint for a bad NAME.
bool ZmqEndpoint(const std::string& end_point, std::string* ipc, std::string* err);

// A message whose frame 0 starts with the slot magic.
bool IsSlotMessage(const std::vector<wire::Frame>& frames);
// Decodes frame 0 (a native header with magic FBWS) and frame 1 (the slot
// descriptor); tensors get dtype, shape and nbytes, data stays null until
// SlotReader::Resolve. Fields: frames, slot.magic, slot.region, slot.length,
// tensor[i].nbytes, and the header's own.
bool DecodeSlotMessage(const std::vector<wire::Frame>& frames, size_t total_frames, wire::NativeHeader* header,
                       std::vector<wire::TensorView>* tensors, SlotRef* ref, wire::WireError* err);

// One mapped region; unmapped when the last holder (the reader's table, a
// lease) lets go, so a region retired while a batch is copied out of it stays
// mapped until that copy is done.
// Called with (base, size, 1) once a region is mapped and (base, size, 0)
// just before it is unmapped: e.g. to register it with CUDA (cudaHostRegister)
// so copies to a GPU read the slots by DMA, and to unregister it in time.
using MapHook = void (*)(void* base, uint64_t size, int mapped);

struct Mapping {
  Mapping(char* b, size_t s, MapHook h) : base(b), size(s), hook(h) {}
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  char* base;
  size_t size;
  MapHook hook;
};

// Hands a slot back to its producer when destroyed (or on Release()).
class SlotLease {
 public:
  SlotLease() = default;
  ~SlotLease() { Release(); }
  SlotLease(const SlotLease&) = delete;
  SlotLease& operator=(const SlotLease&) = delete;
  void Release();
  bool held() const { return state_ != nullptr; }

 private:
  friend class SlotReader;
  uint32_t* state_ = nullptr;
  std::shared_ptr<Mapping> mapping_;  // keeps the slot mapped while the lease is held
};

// The regions one consumer has mapped. Thread-safe.
//
// A region is unmapped once it can carry no more batches: its producer has
// exited, or has made a newer region (it makes one for each new consumer).
// That is checked whenever a new region is mapped, so a long-running consumer
// holds one region per live producer worker. Slot messages still queued for a
// region unmapped so ("retired") are to be skipped: see Retired().
class SlotReader {
 public:
  SlotReader() = default;
  ~SlotReader();
  SlotReader(const SlotReader&) = delete;
  SlotReader& operator=(const SlotReader&) = delete;

  // Points the tensors' data into the slot `ref` names, after checking that
  // the region is ours and well-formed, the slot index, each tensor's offset
  // and size against the slot, and that the slot is published. The lease
  // gives the slot back. False with `err` (field: why) otherwise.
  bool Resolve(const SlotRef& ref, std::vector<wire::TensorView>* tensors, SlotLease* lease, wire::WireError* err);

  // Set before the first slot message (see MapHook); null: none.
  void SetMapHook(MapHook hook) { hook_ = hook; }

  // True when regions are mapped and every slot of every one is taken by this
  // consumer (`slots`: how many): no producer can publish until one is released.
  bool AllTaken(uint32_t* slots);

  // Listens for regions handed over by shm://NAME's producers (an abstract
  // unix socket; only peers of this user, each only for regions labelled with
  // its own pid). False with `err` (e.g. another consumer has NAME).
  bool Listen(const std::string& end_point, std::string* err);

  // Accepts what waits on the hand-over socket without waiting: other users'
  // connections are closed, this user's hand-overs kept for Map(). Called
  // from the receive loop, so nobody can hold the socket's backlog full.
  void Poll();

  // True for a region this reader unmapped because its producer exited or
  // moved on: its slot messages carry batches nobody can read any more.
  bool Retired(const std::string& region);

 private:
  struct Region {
    std::shared_ptr<Mapping> mapping;
    uint32_t slots = 0;
    uint64_t slot_size = 0;
    uint64_t data_offset = 0;
  };
  bool Map(const std::string& name, Region* region, wire::WireError* err);
  void Prune(const std::string& added);  // with mu_ held
  int TakeHandedOver(const std::string& name, int wait_ms);  // with mu_ held; -1 if it never came
  void DrainHandovers();                                     // with mu_ held
  bool ReadPeer(size_t i);  // with mu_ held: takes what peers_[i] sent; false while it has sent nothing

  struct Peer {
    int fd;
    long pid;
    std::chrono::steady_clock::time_point drop_at;
  };

  std::mutex mu_;
  MapHook hook_ = nullptr;
  int listen_fd_ = -1;
  std::map<std::string, int> handed_over_;  // descriptors not yet named by a slot message
  std::deque<std::string> handed_over_order_;
  std::deque<Peer> peers_;  // this user's hand-over peers that have not sent yet, oldest first
  std::map<std::string, Region> regions_;
  std::set<std::string> retired_;
  std::deque<std::string> retired_order_;  // oldest first, forgotten past kMaxRetired
};

}  // namespace shm
}  // namespace feedbench

#endif  // FEEDBENCH_ZMQ_OPS_SHM_H_
