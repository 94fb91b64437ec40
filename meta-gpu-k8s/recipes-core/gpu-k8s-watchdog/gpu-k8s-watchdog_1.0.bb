SUMMARY = "Turns on the hardware watchdog so a hung node resets and rolls back"
DESCRIPTION = "A systemd manager drop-in (vendor system.conf.d) that arms /dev/watchdog0 \
with a 30 s runtime and a 10 min reboot timeout: a hung update boot resets the board and the \
bootloader's boot counter returns to the old slot."
HOMEPAGE = "https://github.com/meta-gpu-k8s/meta-gpu-k8s"
LICENSE = "MIT"
# nooelint: oelint.var.licenseremotefile - no upstream source: our own config file, MIT
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/MIT;md5=0835ade698e0bcf8506ecda2f7b4f302"

SRC_URI = "file://60-gpu-k8s-watchdog.conf"

S = "${UNPACKDIR}"

inherit allarch

do_install() {
    install -d ${D}${systemd_unitdir}/system.conf.d
    install -m 0644 ${UNPACKDIR}/60-gpu-k8s-watchdog.conf ${D}${systemd_unitdir}/system.conf.d/
}

FILES:${PN} += "${systemd_unitdir}/system.conf.d"

RDEPENDS:${PN} = "systemd"
