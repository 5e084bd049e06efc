#include "leanloader/core/error.h"

#include <cerrno>
#include <cstring>
#include <new>

namespace leanloader {

namespace {

std::string describe_os_error(const std::string& what, const std::string& path, int error_number) {
  return what + " '" + path + "': " + std::strerror(error_number);
}

std::string sample_message(int64_t sample_index, const std::string& source,
                           const std::string& location, const std::string& stage,
                           const std::string& cause) {
  std::string message = "sample " + std::to_string(sample_index);
  if (!location.empty()) message += " (" + location + ")";
  message += " of " + source + ", stage '" + stage + "': " + cause;
  return message;
}

}  // namespace

IoError::IoError(const std::string& what, const std::string& path, int error_number)
    : Error(describe_os_error(what, path, error_number),
            error_number == ENOENT ? ErrorKind::kNotFound : ErrorKind::kIo, error_number) {}

SampleError::SampleError(int64_t sample_index, std::string source, std::string location,
                         std::string stage, const Error& cause)
    : Error(sample_message(sample_index, source, location, stage, cause.what()), cause.kind(),
            cause.error_number()),
      sample_index_(sample_index),
      source_(std::move(source)),
      location_(std::move(location)),
      stage_(std::move(stage)),
      cause_(cause.what()) {}

SampleError::SampleError(int64_t sample_index, std::string source, std::string location,
                         std::string stage, const std::string& cause_message, ErrorKind kind)
    : Error(sample_message(sample_index, source, location, stage, cause_message), kind),
      sample_index_(sample_index),
      source_(std::move(source)),
      location_(std::move(location)),
      stage_(std::move(stage)),
      cause_(cause_message) {}

SampleError make_sample_error(int64_t sample_index, const std::string& source,
                              const std::string& location, const std::string& stage,
                              std::exception_ptr caught) {
  try {
    std::rethrow_exception(caught);
  } catch (const SampleError& e) {
    // Already has context (a nested source); keep the innermost description.
    return e;
  } catch (const Error& e) {
    return SampleError(sample_index, source, location, stage, e);
  } catch (const std::bad_alloc&) {
    return SampleError(sample_index, source, location, stage, "out of memory",
                       ErrorKind::kOutOfMemory);
  } catch (const std::exception& e) {
    return SampleError(sample_index, source, location, stage, e.what(), ErrorKind::kGeneric);
  } catch (...) {
    return SampleError(sample_index, source, location, stage, "unknown exception",
                       ErrorKind::kGeneric);
  }
}

}  // namespace leanloader
