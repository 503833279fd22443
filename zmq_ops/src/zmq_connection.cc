// The ZMQ PULL connection resource (see zmq_connection.h).

#include "zmq_connection.h"

#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/errors.h"

namespace feedbench {

absl::Status ToTf(const core::Status& s) {
  switch (s.code) {
    case core::Code::kOk:
      return absl::OkStatus();
    case core::Code::kInvalidArgument:
      return absl::InvalidArgumentError(s.message);
    case core::Code::kDeadlineExceeded:
      return absl::DeadlineExceededError(s.message);
    case core::Code::kCancelled:
      return absl::CancelledError(s.message);
    case core::Code::kUnavailable:
      return absl::UnavailableError(s.message);
    case core::Code::kResourceExhausted:
      return absl::ResourceExhaustedError(s.message);
    case core::Code::kInternal:
      break;
  }
  return absl::InternalError(s.message);
}

absl::Status ZmqConnection::Create(const ConnectionOptions& options, ZmqConnection** out) {
  *out = nullptr;
  if (options.num_threads < 1) return tensorflow::errors::InvalidArgument("num_threads must be >= 1");
  auto* conn = new ZmqConnection(options);
  absl::Status s = ToTf(conn->core_.Open());
  if (!s.ok()) {
    conn->Unref();  // a ref-counted resource is released, never deleted
    return s;
  }
  conn->pool_ = std::make_unique<tensorflow::thread::ThreadPool>(tensorflow::Env::Default(), "zmq_pull",
                                                                 options.num_threads);
  *out = conn;
  return absl::OkStatus();
}

ZmqConnection::~ZmqConnection() {
  // Receives in flight see the close within one slice and return Cancelled;
  // destroying the pool waits for them (and runs any still queued), so no
  // receive thread touches the socket after this point. core_ is destroyed
  // after this body, closing the socket.
  core_.BeginClose();
  pool_.reset();
}

absl::Status ZmqConnection::Receive(Message* msg, tensorflow::CancellationManager* cancel) {
  std::function<bool()> cancelled;
  if (cancel != nullptr) cancelled = [cancel] { return cancel->IsCancelled(); };
  return ToTf(core_.Receive(msg, cancelled));
}

}  // namespace feedbench
