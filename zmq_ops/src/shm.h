// Shared-memory slots for shm://NAME endpoints (the consumer's side).
//
// Design (docs/wire.md, "Shared memory"; Python side: wire/shm.py): each
// producer worker owns a region /dev/shm/fb-<pid>-<32 random hex> (mode
// 0600) of N slots, writes a whole batch into a free slot, marks it
// published and only then sends a small slot message over ZMQ (an ipc socket
// in a private folder, derived from NAME). The consumer maps the region on
// first sight and unlinks its name at once (so nothing is left in /dev/shm
// whoever dies later), checks every field of the slot message against the
// region before it reads a byte, copies the tensors out and marks the slot
// free again (the producer polls the slot states for a free one).
//
// Nothing here depends on TensorFlow or on a socket.

#ifndef FEEDBENCH_ZMQ_OPS_SHM_H_
#define FEEDBENCH_ZMQ_OPS_SHM_H_

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
// The ipc:// endpoint that carries shm://NAME's slot messages, in the private
// folder /tmp/feedbench-<uid> (created 0700; refused if someone else owns it
// or others may enter it). False with `err` naming the endpoint otherwise.
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
struct Mapping {
  Mapping(char* b, size_t s) : base(b), size(s) {}
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  char* base;
  size_t size;
};

// Hands a slot back to its producer when destroyed (or on Release()).
class SlotLease {
 public:
  SlotLease() = default;
  ~SlotLease() { Release(); }
  SlotLease(const SlotLease&) = delete;
  SlotLease& operator=(const SlotLease&) = delete;
  void Release();

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
  ~SlotReader() = default;
  SlotReader(const SlotReader&) = delete;
  SlotReader& operator=(const SlotReader&) = delete;

  // Points the tensors' data into the slot `ref` names, after checking that
  // the region is ours and well-formed, the slot index, each tensor's offset
  // and size against the slot, and that the slot is published. The lease
  // gives the slot back. False with `err` (field: why) otherwise.
  bool Resolve(const SlotRef& ref, std::vector<wire::TensorView>* tensors, SlotLease* lease, wire::WireError* err);

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

  std::mutex mu_;
  std::map<std::string, Region> regions_;
  std::set<std::string> retired_;
  std::deque<std::string> retired_order_;  // oldest first, forgotten past kMaxRetired
};

}  // namespace shm
}  // namespace feedbench

#endif  // FEEDBENCH_ZMQ_OPS_SHM_H_
