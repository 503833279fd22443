// The receive core shared by the TensorFlow op and the TF-free receiver.
//
// A Connection is one ZMQ PULL socket: it opens and configures the socket
// (high-water mark, frame size cap, optional CURVE with client
// authentication), takes whole messages off it, decodes them (wire_decode.h)
// and keeps the per-producer sequence accounting. It knows nothing of
// TensorFlow or Python: the op (zmq_connection.h) and the receiver library
// (receiver.cc) wrap it, so both consumers share one socket, decoder and
// accounting implementation.
//
// Thread-safety: Receive may be called from several threads; they queue on a
// mutex held only while one message is taken off the socket and decoded
// (views only, no copies), so the counters see messages in arrival order.

#ifndef FEEDBENCH_ZMQ_OPS_ZMQ_CORE_H_
#define FEEDBENCH_ZMQ_OPS_ZMQ_CORE_H_

#include <zmq.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shm.h"
#include "wire_decode.h"

namespace feedbench {
namespace core {

enum class Code { kOk, kInvalidArgument, kDeadlineExceeded, kCancelled, kInternal, kUnavailable, kResourceExhausted };

// The outcome of a core call: a code and one line naming what went wrong.
struct Status {
  Code code = Code::kOk;
  std::string message;
  bool ok() const { return code == Code::kOk; }
  static Status Ok() { return {}; }
};

#define FB_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::feedbench::core::Status _s = (expr);   \
    if (!_s.ok()) return _s;                 \
  } while (0)

struct ConnectionOptions {
  std::string end_point;  // ipc://, tcp://, or shm://NAME (shared-memory slots, shm.h)
  int hwm = 10;               // ZMQ_RCVHWM, in messages
  bool bind = true;           // bind (consumer side listens) or connect
  int64_t timeout_ms = -1;    // per receive; -1 waits forever
  int64_t max_msg_size = -1;  // ZMQ_MAXMSGSIZE, per frame; -1 is unlimited
  // A folder made by `python -m producers make-keys`: when set, the socket is
  // a CURVE server (or client, when connecting) and, as a server, admits only
  // peers whose public key is one of the folder's *.key files.
  std::string curve_keys_dir;
};

// Per-producer counts from native headers' (producer_id, seq), the same rules
// as consumers/accounting.py: the first seq seen is where this consumer
// joined (not loss), then a jump is loss, a repeat a duplicate, a fresh 0 a
// restarted producer. Not thread-safe; Connection guards it.
struct ProducerCount {
  int64_t received = 0, lost = 0, duplicated = 0, restarts = 0;  // lost saturates at INT64_MAX
  bool joined = false;     // a seq has been seen (any of 0 .. 2^64 - 1)
  uint64_t joined_at = 0;  // the first seq seen
  uint64_t next_seq = 0;
};

class SeqTracker {
 public:
  void Add(uint32_t producer_id, uint64_t seq);
  const std::map<uint32_t, ProducerCount>& counts() const { return producers_; }

 private:
  std::map<uint32_t, ProducerCount> producers_;
};

// All frames of one received multipart message. Owns the zmq_msg_t buffers;
// frames past kKeptFrames are received and dropped, but still counted, so a
// peer that sends a million frames costs the receiver no memory beyond ZMQ's.
class Message {
 public:
  static constexpr size_t kKeptFrames = wire::kMaxTensors + 2;

  Message() = default;
  Message(const Message&) = delete;
  Message& operator=(const Message&) = delete;
  ~Message();

  std::vector<wire::Frame> Frames() const;
  size_t total_frames() const { return total_frames_; }
  size_t total_bytes() const { return total_bytes_; }

  // What Receive decoded: the tensors (views into the frames) when `ok`,
  // otherwise `error` names the bad field. `header` is set for native only.
  bool ok() const { return ok_; }
  bool native() const { return native_; }
  // A shared-memory slot message (shm.h): tensors have no data until
  // Connection::ResolveSlot points them into the producer's region.
  bool slot_message() const { return slot_message_; }
  const shm::SlotRef& slot() const { return slot_; }
  // Bytes of the batch: the frames, or for a slot message its tensors.
  size_t payload_bytes() const;
  const wire::NativeHeader& header() const { return header_; }
  const std::vector<wire::TensorView>& tensors() const { return tensors_; }
  const wire::WireError& error() const { return error_; }

 private:
  friend class Connection;
  void Decode();
  void Clear();  // back to an empty message (frees the frames)

  // Each zmq_msg_t stays where ZMQ initialised it (ZMQ forbids copying one).
  std::vector<std::unique_ptr<zmq_msg_t>> msgs_;
  size_t total_frames_ = 0;
  size_t total_bytes_ = 0;
  bool ok_ = false;
  bool native_ = false;
  bool slot_message_ = false;
  shm::SlotRef slot_;
  wire::NativeHeader header_;
  std::vector<wire::TensorView> tensors_;
  wire::WireError error_;
};

class Connection {
 public:
  explicit Connection(const ConnectionOptions& options);
  ~Connection();  // calls Close()
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Opens, configures and binds/connects the socket; errors name the endpoint.
  Status Open();
  // Makes receives in flight return Cancelled within one slice; call before
  // waiting for the threads that may be inside Receive, then destroy.
  void BeginClose() { closing_.store(true); }
  bool closing() const { return closing_.load(); }

  const ConnectionOptions& options() const { return options_; }
  std::string DebugString() const;

  // Waits for one whole message, at most timeout_ms (DeadlineExceeded), and
  // gives up with Cancelled when `cancelled()` says so or the connection is
  // closing. `cancelled` may be empty. On OK the message is decoded (see
  // Message::ok) and, if well-formed, counted. `timeout_ms` overrides the
  // option when >= -1.
  Status Receive(Message* msg, const std::function<bool()>& cancelled, int64_t timeout_ms = -2);

  // Rows of (producer_id, counts), and totals (messages, bytes) over every
  // well-formed message of either format (a slot message's bytes once its slot was read).
  std::map<uint32_t, ProducerCount> ProducerCounts() const;
  void Totals(int64_t* messages, int64_t* bytes) const;

  // Peers the CURVE handshake turned away so far, and why (empty if none):
  // added to timeout errors so a run fed by a producer with the wrong keys
  // says so instead of just waiting.
  std::string AuthFailures() const;

  // Called as shm:// regions are mapped and unmapped (shm::MapHook); set before Open.
  void SetMapHook(shm::MapHook hook) { slots_.SetMapHook(hook); }

  // For a slot message: points `tensors` (a copy of msg.tensors()) into the
  // producer's slot and claims it; the lease hands it back. Otherwise a no-op.
  // False with `err` naming the field (never reading outside the region).
  // Its bytes join the totals only then: a refused slot message delivered none.
  bool ResolveSlot(const Message& msg, std::vector<wire::TensorView>* tensors, shm::SlotLease* lease,
                   wire::WireError* err);

 private:
  Status OpenCurve();
  void AuthLoop();
  Status TakeMessage(Message* msg);
  // Counts a well-formed message as Receive takes it (its bytes, but a slot message's: ResolveSlot's).
  void Account(const Message& msg);
  void AddBytesLocked(uint64_t add);  // with stats_mu_ held
  Status StopReason(const std::function<bool()>& cancelled, int64_t deadline_ms, int64_t timeout_ms) const;

  // How long a receive may wait while this consumer itself holds every slot
  // of every producer's region (tensors over slots kept alive) before it
  // says so instead of hanging: no producer can send until one is released.
  static constexpr int64_t kStarvedMs = 10000;

  ConnectionOptions options_;
  void* context_ = nullptr;
  void* socket_ = nullptr;
  std::string bound_file_;  // the ipc socket file this connection bound: removed when it closes
  std::timed_mutex socket_mu_;  // held only while a message is taken off the socket
  std::atomic<bool> closing_{false};
  shm::SlotReader slots_;

  mutable std::mutex stats_mu_;  // guards the counters below
  SeqTracker tracker_;
  int64_t messages_ = 0;
  int64_t bytes_ = 0;

  // CURVE server side: a ZAP handler admitting the folder's client keys, and
  // a socket monitor reporting failed handshakes; both on auth_thread_,
  // which runs until the destructor has turned the monitor off (auth_stop_):
  // libzmq's I/O thread blocks sending an event to a monitor nobody reads.
  std::vector<std::string> client_keys_;  // 32-byte binary public keys
  void* zap_ = nullptr;
  void* monitor_ = nullptr;
  std::thread auth_thread_;
  std::atomic<bool> auth_stop_{false};
  mutable std::mutex auth_mu_;
  int64_t auth_failures_ = 0;
  std::string auth_reason_;
};

// Public and secret key (Z85, 40 characters) of `name` in a make-keys folder,
// and the public keys of every *.key file in it; errors name the file.
Status LoadCurveKey(const std::string& dir, const std::string& name, bool secret, std::string* public_z85,
                    std::string* secret_z85);
Status LoadClientKeys(const std::string& dir, std::vector<std::string>* binary_keys);

}  // namespace core
}  // namespace feedbench

#endif  // FEEDBENCH_ZMQ_OPS_ZMQ_CORE_H_
