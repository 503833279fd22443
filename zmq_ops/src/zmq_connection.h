// A ZMQ PULL socket shared by the pull ops of one graph, as a TF resource.
//
// The connection owns a small thread pool on which ZMQPull runs its blocking
// receive, so a pull that waits for a producer does not hold one of
// TensorFlow's inter-op threads. The socket is guarded by a mutex that is held
// only while one whole message is taken off the socket and its headers are
// read (views only, no copies), so the per-producer counters see messages in
// the order they arrived; copying into the output tensors happens after the
// lock is released, so several pulls in flight (one per tower) overlap it.

#ifndef FEEDBENCH_ZMQ_OPS_ZMQ_CONNECTION_H_
#define FEEDBENCH_ZMQ_OPS_ZMQ_CONNECTION_H_

#include <zmq.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/resource_base.h"
#include "tensorflow/core/lib/core/threadpool.h"
#include "tensorflow/core/platform/status.h"
#include "wire_decode.h"

namespace feedbench {

struct ConnectionOptions {
  std::string end_point;
  int hwm = 10;                // ZMQ_RCVHWM, in messages
  bool bind = true;            // bind (consumer side listens) or connect
  int64_t timeout_ms = -1;     // per pull; -1 waits forever
  int64_t max_msg_size = -1;   // ZMQ_MAXMSGSIZE, per frame; -1 is unlimited
  int num_threads = 4;         // receive threads, i.e. pulls that can wait at once
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
  const wire::NativeHeader& header() const { return header_; }
  const std::vector<wire::TensorView>& tensors() const { return tensors_; }
  const wire::WireError& error() const { return error_; }

 private:
  friend class ZmqConnection;
  void Decode();

  // Each zmq_msg_t stays where ZMQ initialised it (ZMQ forbids copying one).
  std::vector<std::unique_ptr<zmq_msg_t>> msgs_;
  size_t total_frames_ = 0;
  size_t total_bytes_ = 0;
  bool ok_ = false;
  bool native_ = false;
  wire::NativeHeader header_;
  std::vector<wire::TensorView> tensors_;
  wire::WireError error_;
};

class ZmqConnection : public tensorflow::ResourceBase {
 public:
  // Opens, configures and binds/connects the socket; errors name the endpoint.
  static absl::Status Create(const ConnectionOptions& options, ZmqConnection** out);
  ~ZmqConnection() override;

  std::string DebugString() const override;
  const ConnectionOptions& options() const { return options_; }

  // Per-producer accounting from native headers' (producer_id, seq), the same
  // rules as consumers/accounting.py: a jump is loss, a repeat a duplicate, a
  // fresh 0 a restarted producer. Receive calls it, under the socket lock, for
  // every well-formed native message, in arrival order.
  struct ProducerCount {
    int64_t received = 0, lost = 0, duplicated = 0, restarts = 0;
    uint64_t next_seq = 0;
  };
  void Account(uint32_t producer_id, uint64_t seq, size_t bytes);
  // Rows of (producer_id, received, lost, duplicated, restarts), and totals
  // (messages, bytes) over every well-formed message of either format.
  std::map<uint32_t, ProducerCount> ProducerCounts() const;
  void Totals(int64_t* messages, int64_t* bytes) const;
  void CountMessage(size_t bytes);

  // Runs `fn` on the connection's receive threads.
  void Schedule(std::function<void()> fn) { pool_->Schedule(std::move(fn)); }

  // Waits for one whole message, at most timeout_ms (DeadlineExceeded), and
  // gives up with Cancelled when the step is cancelled or the connection is
  // being destroyed. `cancel` may be null. On OK the message is decoded (see
  // Message::ok) and, if well-formed, counted.
  absl::Status Receive(Message* msg, tensorflow::CancellationManager* cancel);

 private:
  explicit ZmqConnection(const ConnectionOptions& options);
  absl::Status Open();
  // Takes every frame of the message that is ready on the socket.
  absl::Status TakeMessage(Message* msg);
  absl::Status StopReason(tensorflow::CancellationManager* cancel, int64_t deadline_ms) const;

  ConnectionOptions options_;
  void* context_ = nullptr;
  void* socket_ = nullptr;
  std::timed_mutex socket_mu_;  // held only while a message is taken off the socket
  std::atomic<bool> closing_{false};
  std::unique_ptr<tensorflow::thread::ThreadPool> pool_;
  mutable std::mutex stats_mu_;  // guards the counters below
  std::map<uint32_t, ProducerCount> producers_;
  int64_t messages_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace feedbench

#endif  // FEEDBENCH_ZMQ_OPS_ZMQ_CONNECTION_H_
