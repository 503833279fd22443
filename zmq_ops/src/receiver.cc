// The TF-free receiver: native threads that receive batches and write each
// one straight into caller-provided buffers (a ring of slots), behind a small
// C API for ctypes (zmq_ops/receiver.py).
//
// It reuses the op's receive core (zmq_core.h): the same socket options,
// decoders, CURVE handling and sequence accounting. Each receive thread takes
// a free slot, receives one message (socket order is kept by the core's
// lock), checks it against the expected fields and copies each tensor once
// into the slot's buffers; the caller takes ready slots with next() and gives
// them back with release(). A malformed or mismatched batch is not written
// anywhere: next() reports it with the field named, and the slot stays free.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "wire_decode.h"
#include "zmq_core.h"

namespace feedbench {
namespace {

using core::Code;
using core::Status;

constexpr int64_t kSliceMs = 50;

struct Field {
  int dtype = 0;
  std::vector<int64_t> shape;
  size_t nbytes = 0;
};

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t j = 0; j < shape.size(); ++j) s += (j ? ", " : "") + std::to_string(shape[j]);
  return s + "]";
}

void CopyOut(char* dst, const char* src, size_t n, int dtype) {
  if (n == 0) return;
  if (dtype == 10) {  // bool: any byte other than 0 or 1 would be an invalid bool
    for (size_t k = 0; k < n; ++k) dst[k] = src[k] != 0;
  } else {
    std::memcpy(dst, src, n);
  }
}

class Receiver {
 public:
  enum SlotState { kFree, kFilling, kReady, kHeld };
  // Bad messages (and receive errors) since next() last reported them: a count and the last one's words, so
  // a flood of malformed messages costs no memory per message and never queues ahead of a good batch.
  struct Errors {
    int64_t count = 0;
    std::string last;
  };

  // Zero-copy: what a ring slot holds instead of a copy.
  struct Held {
    std::unique_ptr<core::Message> msg;      // the frames (non-shm messages)
    std::shared_ptr<shm::SlotLease> lease;   // the producer's slot (shm://)
    std::vector<char*> data;                 // each tensor's address
  };

  Receiver(const core::ConnectionOptions& options, std::vector<Field> fields, std::vector<std::vector<char*>> slots,
           int64_t timeout_ms, bool zero_copy, shm::MapHook map_hook)
      : conn_(options),
        fields_(std::move(fields)),
        slots_(std::move(slots)),
        state_(slots_.size(), kFree),
        timeout_ms_(timeout_ms),
        zero_copy_(zero_copy),
        held_(slots_.size()) {
    for (size_t i = 0; i < slots_.size(); ++i) free_.push_back(static_cast<int>(i));
    conn_.SetMapHook(map_hook);
  }

  ~Receiver() { Stop(); }

  Status Start(int threads) {
    FB_RETURN_IF_ERROR(conn_.Open());
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
    return Status::Ok();
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    conn_.BeginClose();
    cv_free_.notify_all();
    cv_ready_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  // >= 0: a ready slot; -1 timeout, -2 a bad batch, -3 closed; `err` says why.
  int Next(int64_t timeout_ms, std::string* err) {
    if (timeout_ms < -1) timeout_ms = timeout_ms_;
    std::unique_lock<std::mutex> lock(mu_);
    if (ready_.empty() && std::all_of(state_.begin(), state_.end(), [](SlotState st) { return st == kHeld; })) {
      *err = "all " + std::to_string(state_.size()) + " slots of the receiver for " + conn_.options().end_point +
             " are held: release a batch (or drop its arrays) before asking for the next, or open more slots";
      return -2;
    }
    auto have = [this] { return stopping_ || !ready_.empty() || errors_.count > 0; };
    if (timeout_ms < 0) {
      cv_ready_.wait(lock, have);
    } else if (!cv_ready_.wait_for(lock, std::chrono::milliseconds(timeout_ms), have)) {
      *err = "no batch from " + conn_.options().end_point + " within " + std::to_string(timeout_ms) + " ms";
      const std::string auth = conn_.AuthFailures();
      if (!auth.empty()) *err += "; " + auth;
      return -1;
    }
    if (!ready_.empty()) {  // a good batch first, however many bad ones came before it
      const int slot = ready_.front();
      ready_.pop_front();
      state_[slot] = kHeld;
      return slot;
    }
    if (errors_.count > 0) {
      *err = errors_.count > 1 ? std::to_string(errors_.count) + " bad messages; the last: " + errors_.last
                               : errors_.last;
      errors_ = Errors();
      return -2;
    }
    *err = "receiver for " + conn_.options().end_point + " is closed";
    return -3;
  }

  // Bad messages (and receive errors) so far.
  int64_t bad() {
    std::lock_guard<std::mutex> lock(mu_);
    return bad_;
  }

  bool Release(int slot, std::string* err) {
    std::lock_guard<std::mutex> lock(mu_);
    if (slot < 0 || slot >= static_cast<int>(slots_.size()) || state_[slot] != kHeld) {
      *err = "slot " + std::to_string(slot) + " is not held (release only what next() returned, once)";
      return false;
    }
    state_[slot] = kFree;
    held_[slot] = Held();  // hands a zero-copy batch's slot back to its producer
    free_.push_back(slot);
    cv_free_.notify_one();
    return true;
  }

  // Zero-copy: the addresses of a held slot's tensors.
  bool Data(int slot, void** ptrs, int n, std::string* err) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!zero_copy_ || slot < 0 || slot >= static_cast<int>(slots_.size()) || state_[slot] != kHeld ||
        n != static_cast<int>(held_[slot].data.size())) {
      *err = "slot " + std::to_string(slot) + " is not a held zero-copy batch of " + std::to_string(n) + " tensors";
      return false;
    }
    for (int i = 0; i < n; ++i) ptrs[i] = held_[slot].data[i];
    return true;
  }

  const core::Connection& conn() const { return conn_; }

 private:
  // A free slot, or -1 when stopping.
  int TakeFree() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_free_.wait(lock, [this] { return stopping_ || !free_.empty(); });
    if (stopping_) return -1;
    const int slot = free_.front();
    free_.pop_front();
    state_[slot] = kFilling;
    return slot;
  }

  // `slot` filled (no error), or back to the free slots with `error` counted; `closed`: neither.
  void Finish(int slot, std::string error, bool closed = false) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error.empty() || closed) {
      state_[slot] = kFree;
      free_.push_front(slot);
      if (closed) return;
      bad_ += 1;
      errors_.count += 1;
      errors_.last = std::move(error);
    } else {
      state_[slot] = kReady;
      ready_.push_back(slot);
    }
    cv_ready_.notify_one();
  }

  void Loop() {
    auto stopping = [this] { return conn_.closing(); };
    while (true) {
      const int slot = TakeFree();
      if (slot < 0) return;
      while (true) {
        auto msg = std::make_unique<core::Message>();
        Status s = conn_.Receive(msg.get(), stopping, kSliceMs);
        if (s.code == Code::kDeadlineExceeded) continue;
        if (s.code == Code::kCancelled) {
          Finish(slot, "", true);
          return;
        }
        if (!s.ok()) {
          Finish(slot, s.message);
          break;
        }
        Finish(slot, Fill(std::move(msg), slot));
        break;
      }
    }
  }

  // Checks a received message against the fields and copies it into `slot`;
  // returns "" or the error naming the field.
  std::string Fill(std::unique_ptr<core::Message> owned, int slot) {
    const core::Message& msg = *owned;
    const std::string& ep = conn_.options().end_point;
    if (!msg.ok()) {
      return std::string("bad ") + (msg.native() ? "native" : "zmq_ops") + " message from " + ep + ": " +
             msg.error().ToString();
    }
    std::vector<wire::TensorView> tensors = msg.tensors();
    // A shared-memory slot goes back to its producer after the copy (or, zero-copy, on release).
    auto lease = std::make_shared<shm::SlotLease>();
    wire::WireError werr;
    if (!conn_.ResolveSlot(msg, &tensors, lease.get(), &werr)) {
      return "bad slot message from " + ep + ": " + werr.ToString();
    }
    if (tensors.size() != fields_.size()) {
      return "n_tensors: message from " + ep + " has " + std::to_string(tensors.size()) +
             " tensors, the receiver expects " + std::to_string(fields_.size());
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      const wire::TensorView& t = tensors[i];
      const Field& f = fields_[i];
      const std::string field = "tensor[" + std::to_string(i) + "]";
      if (t.dtype != f.dtype) {
        return field + ".dtype: message from " + ep + " has " + wire::DtypeName(t.dtype) + ", the receiver expects " +
               wire::DtypeName(f.dtype);
      }
      if (t.shape != f.shape) {
        return field + ".shape: message from " + ep + " has " + ShapeString(t.shape) + ", the receiver expects " +
               ShapeString(f.shape);
      }
    }
    if (zero_copy_) {
      Held h;
      for (size_t i = 0; i < tensors.size(); ++i) {
        char* p = const_cast<char*>(tensors[i].data);  // ours until released: the producer's slot or our frames
        if (fields_[i].dtype == 10) CopyOut(p, p, tensors[i].nbytes, 10);  // bools made valid in place
        h.data.push_back(p);
      }
      h.lease = std::move(lease);
      h.msg = std::move(owned);
      std::lock_guard<std::mutex> lock(mu_);
      held_[slot] = std::move(h);
      return "";
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      CopyOut(slots_[slot][i], tensors[i].data, tensors[i].nbytes, fields_[i].dtype);
    }
    return "";
  }

  core::Connection conn_;
  const std::vector<Field> fields_;
  const std::vector<std::vector<char*>> slots_;
  std::vector<SlotState> state_;
  const int64_t timeout_ms_;
  const bool zero_copy_;
  std::vector<Held> held_;  // zero-copy: what each ring slot holds (guarded by mu_)

  std::mutex mu_;
  std::condition_variable cv_free_, cv_ready_;
  std::deque<int> free_;
  std::deque<int> ready_;  // filled slots, in arrival order
  Errors errors_;
  int64_t bad_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

void SetError(char* err, size_t errlen, const std::string& msg) {
  if (err == nullptr || errlen == 0) return;
  const size_t n = std::min(errlen - 1, msg.size());
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}

}  // namespace
}  // namespace feedbench

using feedbench::Receiver;
using feedbench::SetError;

namespace {

// Writes up to max_rows rows of (producer_id, received, lost, duplicated,
// restarts) from per-producer counts; returns how many producers there are.
template <typename Counts>
int FillRows(const Counts& counts, int64_t* rows, int max_rows) {
  int r = 0;
  for (const auto& [id, c] : counts) {
    if (r < max_rows) {
      int64_t* row = rows + 5 * r;
      row[0] = id;
      row[1] = c.received;
      row[2] = c.lost;
      row[3] = c.duplicated;
      row[4] = c.restarts;
    }
    ++r;
  }
  return r;
}

}  // namespace

extern "C" {

// Opens a receiver: `n_fields` tensors per batch, field i of dtype code
// dtypes[i] (TensorFlow's DataType enum, as on the wire) and shape
// dims[sum(ndims[:i]) .. +ndims[i]]; `n_slots` slots whose buffers are (unless
// `zero_copy`: then ptrs may be null and a slot holds a batch in place).
// `map_hook` (may be null): a shm::MapHook called as shm:// regions are mapped
// and unmapped, e.g. to register them with CUDA.
// ptrs[slot * n_fields + i], each at least the field's size. Returns a handle,
// or null with `err` filled.
__attribute__((visibility("default"))) void* fb_receiver_open(
    const char* endpoint, int n_fields, const int* dtypes, const int* ndims, const int64_t* dims, int n_slots,
    void* const* ptrs, int hwm, int64_t timeout_ms, int64_t max_msg_size, int bind, const char* curve_dir,
    int threads, int zero_copy, void* map_hook, char* err, size_t errlen) {
  using feedbench::Field;
  if (n_fields < 1 || n_slots < 1 || threads < 1) {
    SetError(err, errlen, "the receiver needs at least one field, one slot and one thread");
    return nullptr;
  }
  std::vector<Field> fields(n_fields);
  size_t at = 0;
  for (int i = 0; i < n_fields; ++i) {
    Field& f = fields[i];
    f.dtype = dtypes[i];
    const size_t item = feedbench::wire::ItemSize(f.dtype);
    if (item == 0) {
      SetError(err, errlen, "field " + std::to_string(i) + ": unknown dtype code " + std::to_string(f.dtype));
      return nullptr;
    }
    f.nbytes = item;
    for (int j = 0; j < ndims[i]; ++j) {
      f.shape.push_back(dims[at]);
      f.nbytes *= static_cast<size_t>(dims[at++]);
    }
  }
  std::vector<std::vector<char*>> slots(n_slots, std::vector<char*>(n_fields));
  for (int s = 0; s < n_slots; ++s) {
    for (int i = 0; i < n_fields; ++i) slots[s][i] = zero_copy ? nullptr : static_cast<char*>(ptrs[s * n_fields + i]);
  }
  feedbench::core::ConnectionOptions o;
  o.end_point = endpoint;
  o.hwm = hwm;
  o.bind = bind != 0;
  o.max_msg_size = max_msg_size;
  o.curve_keys_dir = curve_dir != nullptr ? curve_dir : "";
  auto* r = new Receiver(o, std::move(fields), std::move(slots), timeout_ms, zero_copy != 0,
                         reinterpret_cast<feedbench::shm::MapHook>(map_hook));
  feedbench::core::Status s = r->Start(threads);
  if (!s.ok()) {
    SetError(err, errlen, s.message);
    delete r;
    return nullptr;
  }
  return r;
}

__attribute__((visibility("default"))) int fb_receiver_next(void* h, int64_t timeout_ms, char* err, size_t errlen) {
  std::string e;
  const int slot = static_cast<Receiver*>(h)->Next(timeout_ms, &e);
  if (slot < 0) SetError(err, errlen, e);
  return slot;
}

__attribute__((visibility("default"))) int fb_receiver_release(void* h, int slot, char* err, size_t errlen) {
  std::string e;
  if (static_cast<Receiver*>(h)->Release(slot, &e)) return 0;
  SetError(err, errlen, e);
  return -1;
}

// Zero-copy: the addresses of the n tensors of held slot `slot`; 0, or -1 with `err`.
__attribute__((visibility("default"))) int fb_receiver_data(void* h, int slot, void** ptrs, int n, char* err,
                                                           size_t errlen) {
  std::string e;
  if (static_cast<Receiver*>(h)->Data(slot, ptrs, n, &e)) return 0;
  SetError(err, errlen, e);
  return -1;
}

// Fills up to max_rows rows of (producer_id, received, lost, duplicated,
// restarts) and totals (messages, bytes); returns the number of producers.
__attribute__((visibility("default"))) int fb_receiver_stats(void* h, int64_t* rows, int max_rows, int64_t* totals) {
  const auto& conn = static_cast<Receiver*>(h)->conn();
  conn.Totals(&totals[0], &totals[1]);
  return FillRows(conn.ProducerCounts(), rows, max_rows);
}

// Wakes every waiter (next() returns -3); call before fb_receiver_close when
// another thread may be inside next().
// Bad messages (and receive errors) the receiver has met so far, reported or not.
__attribute__((visibility("default"))) int64_t fb_receiver_bad(void* h) { return static_cast<Receiver*>(h)->bad(); }

__attribute__((visibility("default"))) void fb_receiver_stop(void* h) { static_cast<Receiver*>(h)->Stop(); }

__attribute__((visibility("default"))) void fb_receiver_close(void* h) { delete static_cast<Receiver*>(h); }

// The core's sequence accounting over (ids[i], seqs[i]), for the shared test
// vectors (wire/seq_vectors.json); rows as in fb_receiver_stats.
__attribute__((visibility("default"))) int fb_seq_replay(const uint32_t* ids, const uint64_t* seqs, int64_t n,
                                                        int64_t* rows, int max_rows) {
  feedbench::core::SeqTracker t;
  for (int64_t i = 0; i < n; ++i) t.Add(ids[i], seqs[i]);
  return FillRows(t.counts(), rows, max_rows);
}

}  // extern "C"
