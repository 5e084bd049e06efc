// Exceptions thrown by the leanloader core.
//
// Contract: every error the core raises derives from leanloader::Error and
// carries a message that gives the values involved (file, sample, sizes).
// The Python bindings map each kind to one Python exception type, so the
// kind is part of the API: see bindings/bind_errors.cc.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>

namespace leanloader {

enum class ErrorKind {
  kGeneric,          // leanloader.Error (RuntimeError)
  kFormat,           // malformed bytes: leanloader.FormatError (ValueError)
  kInvalidArgument,  // bad call: ValueError
  kIo,               // an OS call failed: OSError with errno
  kNotFound,         // a path does not exist: FileNotFoundError
  kOutOfMemory,      // an allocation failed: MemoryError
  kTimeout,          // a deadline passed: TimeoutError
};

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, ErrorKind kind = ErrorKind::kGeneric,
                 int error_number = 0)
      : std::runtime_error(message), kind_(kind), error_number_(error_number) {}

  ErrorKind kind() const noexcept { return kind_; }
  // errno of the failed OS call for kIo / kNotFound, 0 otherwise.
  int error_number() const noexcept { return error_number_; }

 private:
  ErrorKind kind_;
  int error_number_;
};

class FormatError : public Error {
 public:
  explicit FormatError(const std::string& message) : Error(message, ErrorKind::kFormat) {}
};

class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& message)
      : Error(message, ErrorKind::kInvalidArgument) {}
};

class IoError : public Error {
 public:
  // Builds "<what> '<path>': <strerror(errno)>"; ENOENT becomes kNotFound.
  IoError(const std::string& what, const std::string& path, int error_number);
};

class OutOfMemory : public Error {
 public:
  explicit OutOfMemory(const std::string& message) : Error(message, ErrorKind::kOutOfMemory) {}
};

class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& message) : Error(message, ErrorKind::kTimeout) {}
};

// A failure while producing one sample, with the context a user needs to find
// the bad input: the sample index, the source, the file or row, the stage.
// The kind and errno of the cause are kept so Python sees the original type.
class SampleError : public Error {
 public:
  SampleError(int64_t sample_index, std::string source, std::string location, std::string stage,
              const Error& cause);
  SampleError(int64_t sample_index, std::string source, std::string location, std::string stage,
              const std::string& cause_message, ErrorKind kind);

  int64_t sample_index() const noexcept { return sample_index_; }
  const std::string& source() const noexcept { return source_; }
  const std::string& location() const noexcept { return location_; }
  const std::string& stage() const noexcept { return stage_; }
  const std::string& cause() const noexcept { return cause_; }

 private:
  int64_t sample_index_;
  std::string source_;
  std::string location_;
  std::string stage_;
  std::string cause_;
};

// Converts whatever a worker caught into a SampleError with context.
SampleError make_sample_error(int64_t sample_index, const std::string& source,
                              const std::string& location, const std::string& stage,
                              std::exception_ptr caught);

}  // namespace leanloader
