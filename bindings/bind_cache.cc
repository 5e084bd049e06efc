// TensorCache (a Source), its writer, SubsetSource and fingerprints. Glue
// only: python/leanloader/cache.py builds the user-facing class on these.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "leanloader/cache/cache_manifest.h"
#include "leanloader/cache/cache_writer.h"
#include "leanloader/cache/tensor_cache.h"
#include "leanloader/io/content_hash.h"
#include "leanloader/sources/subset_source.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace leanloader::bindings {

namespace {

nb::dict fingerprint_to_dict(const SourceFingerprint& fp) {
  nb::dict out;
  out["path"] = fp.path;
  out["size"] = fp.size;
  out["mtime_ns"] = fp.mtime_ns;
  out["content_hash"] = fp.content_hash;
  out["config"] = fp.config;
  return out;
}

SourceFingerprint fingerprint_from_dict(const nb::dict& d) {
  SourceFingerprint fp;
  if (d.contains("path")) fp.path = nb::cast<std::string>(d["path"]);
  if (d.contains("size")) fp.size = nb::cast<uint64_t>(d["size"]);
  if (d.contains("mtime_ns")) fp.mtime_ns = nb::cast<int64_t>(d["mtime_ns"]);
  if (d.contains("content_hash")) fp.content_hash = nb::cast<std::string>(d["content_hash"]);
  if (d.contains("config")) fp.config = nb::cast<std::string>(d["config"]);
  return fp;
}

nb::dict manifest_to_dict(const CacheManifest& manifest) {
  nb::list shards;
  for (const CacheShard& shard : manifest.shards) {
    nb::dict s;
    s["file"] = shard.file;
    s["bytes"] = shard.bytes;
    shards.append(s);
  }
  nb::list entries;
  for (const CacheEntry& entry : manifest.entries) {
    nb::dict e;
    e["key"] = entry.key;
    e["shard"] = entry.shard;
    e["slot"] = entry.slot;
    e["fingerprint"] = fingerprint_to_dict(entry.fingerprint);
    nb::list tensors;
    for (const CacheTensorRecord& t : entry.tensors) {
      nb::dict td;
      td["name"] = t.name;
      td["dtype"] = std::string(dtype_name(t.dtype));
      nb::list shape;
      for (const int64_t dim : t.shape) shape.append(dim);
      td["shape"] = nb::tuple(shape);
      td["offset"] = t.offset;
      td["nbytes"] = t.nbytes;
      td["checksum"] = t.checksum;
      tensors.append(td);
    }
    e["tensors"] = tensors;
    entries.append(e);
  }
  nb::dict out;
  out["shards"] = shards;
  out["entries"] = entries;
  return out;
}

nb::dict entry_to_dict(const TensorCache& cache, int64_t index, const std::string& output) {
  const OutputFramework framework = parse_output_framework(output);
  std::vector<std::pair<std::string, Tensor>> tensors;
  {
    nb::gil_scoped_release release;
    tensors = cache.entry(index);
  }
  nb::dict out;
  for (const auto& [name, tensor] : tensors) {
    try {
      out[nb::str(name.data(), name.size())] = tensor_to_python(tensor, framework);
    } catch (const InvalidArgument& error) {
      throw InvalidArgument(cache.sample_location(index) + " tensor '" + name +
                            "': " + error.what());
    }
  }
  return out;
}

}  // namespace

void bind_cache(nb::module_& m) {
  nb::class_<TensorCache, Source>(m, "TensorCache",
                                  "Tensors cached in safetensors shards (or one file per sample), "
                                  "memory-mapped and shared by every reader.")
      .def(
          "__init__",
          [](TensorCache* self, const std::string& path, bool cleanup) {
            nb::gil_scoped_release release;
            new (self) TensorCache(path, cleanup);
          },
          "path"_a, "cleanup"_a = true)
      .def_prop_ro("layout",
                   [](const TensorCache& self) {
                     return self.layout() == TensorCache::Layout::kSharded ? "sharded"
                                                                           : "per-sample";
                   })
      .def_prop_ro("path", &TensorCache::path)
      .def_prop_ro("removed_on_open", &TensorCache::removed_on_open)
      .def("keys",
           [](const TensorCache& self) {
             nb::list keys;
             for (const CacheEntry& entry : self.manifest()->entries) keys.append(entry.key);
             return keys;
           })
      .def("key", &TensorCache::key, "index"_a)
      .def("find", &TensorCache::find, "key"_a)
      .def("entry", &entry_to_dict, "index"_a, "output"_a = "torch")
      .def("shard_path", &TensorCache::shard_path, "shard"_a)
      .def("manifest", [](const TensorCache& self) { return manifest_to_dict(*self.manifest()); })
      .def("reload",
           [](TensorCache& self) {
             nb::gil_scoped_release release;
             self.reload();
           })
      .def(
          "verify",
          [](const TensorCache& self, bool check_sources, bool check_data) {
            std::vector<CacheProblem> problems;
            {
              nb::gil_scoped_release release;
              problems = self.verify(check_sources, check_data);
            }
            nb::list out;
            for (const CacheProblem& p : problems)
              out.append(nb::make_tuple(p.kind, p.where, p.message));
            return out;
          },
          "check_sources"_a = true, "check_data"_a = false);

  nb::class_<SubsetSource, Source>(m, "SubsetSource")
      .def(nb::init<std::shared_ptr<const Source>, std::vector<int64_t>>(), "base"_a, "indices"_a,
           "Samples `indices` of `base`, in that order.")
      .def_prop_ro("indices", &SubsetSource::indices);

  nb::class_<CacheWriter>(m, "CacheWriter")
      .def(
          "__init__",
          [](CacheWriter* self, const std::string& directory, size_t shard_bytes,
             std::optional<int> rank) {
            CacheWriterOptions options;
            options.shard_bytes = shard_bytes;
            options.rank = rank;
            nb::gil_scoped_release release;
            new (self) CacheWriter(directory, options);
          },
          "directory"_a, "shard_bytes"_a = kDefaultCacheShardBytes, "rank"_a = nb::none())
      .def(
          "is_fresh",
          [](const CacheWriter& self, const std::string& key, const nb::dict& fingerprint) {
            return self.is_fresh(key, fingerprint_from_dict(fingerprint));
          },
          "key"_a, "fingerprint"_a)
      .def(
          "add",
          [](CacheWriter& self, const std::string& key, const nb::dict& fingerprint,
             const nb::dict& tensors) {
            const SourceFingerprint fp = fingerprint_from_dict(fingerprint);
            std::vector<InputArray> arrays;  // held until the bytes are copied
            std::vector<std::pair<std::string, Tensor>> views;
            for (const auto& [name_object, value] : tensors) {
              const std::string name = nb::cast<std::string>(name_object);
              InputArray array;
              if (!nb::try_cast(value, array)) {
                throw nb::type_error(
                    ("tensor '" + name + "' of entry '" + key + "' is not a CPU array").c_str());
              }
              views.emplace_back(name, tensor_view_of(array, name, ArrayLifetime::kBorrowed));
              arrays.push_back(std::move(array));
            }
            nb::gil_scoped_release release;
            self.add(key, fp, views);
          },
          "key"_a, "fingerprint"_a, "tensors"_a)
      .def("flush",
           [](CacheWriter& self) {
             nb::gil_scoped_release release;
             self.flush();
           })
      .def_prop_ro("pending_samples", &CacheWriter::pending_samples)
      .def_prop_ro("pending_bytes", &CacheWriter::pending_bytes)
      .def_prop_ro("shards_published", &CacheWriter::shards_published)
      .def("manifest", [](const CacheWriter& self) { return manifest_to_dict(self.manifest()); });

  m.def(
      "fingerprint_file",
      [](const std::string& path, bool content_hash, const std::string& config) {
        SourceFingerprint fp;
        {
          nb::gil_scoped_release release;
          fp = fingerprint_file(path, content_hash, config);
        }
        return fingerprint_to_dict(fp);
      },
      "path"_a, "content_hash"_a = false, "config"_a = "");
  m.def(
      "fingerprint_matches",
      [](const nb::dict& stored, const nb::dict& current) {
        return fingerprint_matches(fingerprint_from_dict(stored), fingerprint_from_dict(current));
      },
      "stored"_a, "current"_a);
  m.def(
      "merge_cache_rank_manifests",
      [](const std::string& directory) {
        nb::gil_scoped_release release;
        return merge_cache_rank_manifests(directory);
      },
      "directory"_a);
  m.def(
      "content_hash_file",
      [](const std::string& path) {
        nb::gil_scoped_release release;
        return content_hash_file(path);
      },
      "path"_a);
}

}  // namespace leanloader::bindings
