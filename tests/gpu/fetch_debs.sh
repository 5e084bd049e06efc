#!/usr/bin/env bash
# Downloads (apt-get download, no install) the Debian bookworm packages that
# tests/gpu/on_lent_machine.sh unpacks on a GPU machine without network: the
# build's libraries with their headers, what they load, and pkgconf.
#
#   tests/gpu/fetch_debs.sh DEBS_DIR
set -euo pipefail
mkdir -p "$1"
cd "$1"
apt-get download \
  libdeflate-dev libdeflate0 liblz4-dev liblz4-1 libzstd-dev libzstd1 libblosc-dev libblosc1 \
  libsnappy1v5 liblzf-dev liblzf1 zlib1g-dev zlib1g libjpeg62-turbo-dev libjpeg62-turbo \
  libspng-dev libspng0 libwebp-dev libwebp7 libwebpdemux2 libwebpmux3 libtiff-dev libtiff6 \
  libtiffxx6 libjbig-dev libjbig0 liblerc-dev liblerc4 liblzma-dev liblzma5 liblcms2-dev \
  liblcms2-2 libopencv-imgproc-dev libopencv-imgproc406 libopencv-core-dev libopencv-core406 \
  libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5 libhwloc15 libblas3 liblapack3 libgfortran5 \
  libquadmath0 libglx0 libglvnd0 libx11-6 libxcb1 libxau6 libxdmcp6 libbsd0 libmd0 \
  pkgconf pkgconf-bin libpkgconf3
