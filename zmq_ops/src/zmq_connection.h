// A ZMQ PULL connection shared by the pull ops of one graph, as a TF resource.
//
// Wraps the TF-free core::Connection (zmq_core.h: socket, decoding,
// accounting, CURVE) and adds what TensorFlow needs: reference counting, a
// small thread pool on which ZMQPull runs its blocking receive (so a pull that
// waits for a producer does not hold one of TensorFlow's inter-op threads),
// and statuses in TensorFlow's terms. Copying into the output tensors happens
// after the socket lock is released, so several pulls in flight (one per
// tower) overlap it.

#ifndef FEEDBENCH_ZMQ_OPS_ZMQ_CONNECTION_H_
#define FEEDBENCH_ZMQ_OPS_ZMQ_CONNECTION_H_

#include <functional>
#include <memory>
#include <string>

#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/resource_base.h"
#include "tensorflow/core/lib/core/threadpool.h"
#include "tensorflow/core/platform/status.h"
#include "zmq_core.h"

namespace feedbench {

using core::Message;

struct ConnectionOptions : core::ConnectionOptions {
  int num_threads = 4;  // receive threads, i.e. pulls that can wait at once
};

// A core status in TensorFlow's terms (same code, same message).
absl::Status ToTf(const core::Status& s);

class ZmqConnection : public tensorflow::ResourceBase {
 public:
  // Opens, configures and binds/connects the socket; errors name the endpoint.
  static absl::Status Create(const ConnectionOptions& options, ZmqConnection** out);
  ~ZmqConnection() override;

  std::string DebugString() const override { return core_.DebugString(); }
  const ConnectionOptions& options() const { return options_; }
  const core::Connection& core() const { return core_; }

  // Runs `fn` on the connection's receive threads.
  void Schedule(std::function<void()> fn) { pool_->Schedule(std::move(fn)); }

  // Waits for one whole message, at most timeout_ms (DeadlineExceeded), and
  // gives up with Cancelled when the step is cancelled or the connection is
  // being destroyed. `cancel` may be null. On OK the message is decoded (see
  // Message::ok) and, if well-formed, counted.
  absl::Status Receive(Message* msg, tensorflow::CancellationManager* cancel);

 private:
  explicit ZmqConnection(const ConnectionOptions& options) : options_(options), core_(options) {}

  ConnectionOptions options_;
  core::Connection core_;
  std::unique_ptr<tensorflow::thread::ThreadPool> pool_;
};

}  // namespace feedbench

#endif  // FEEDBENCH_ZMQ_OPS_ZMQ_CONNECTION_H_
